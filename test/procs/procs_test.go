package procs

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestReadsThisProcess(t *testing.T) {
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); { //nolint:revive // burn CPU time to read
	}
	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	before, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	after, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if before.RSSBytes <= 0 || before.CPUSeconds <= 0 {
		t.Errorf("usage %+v: want RSS and CPU time above 0", before)
	}
	if after.FDs != before.FDs-1 {
		t.Errorf("open files %d after closing one of %d", after.FDs, before.FDs)
	}
	if _, err := Read(-1); err == nil {
		t.Error("no error for a pid that cannot exist")
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep returned true after its context ended")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep returned false with a live context")
	}
	addr, err := FreeAddr()
	if err != nil || addr == "" {
		t.Errorf("FreeAddr: %q, %v", addr, err)
	}
}
