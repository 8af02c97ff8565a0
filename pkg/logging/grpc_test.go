package logging

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestGRPCsLinesAreTheBinarysFormat: gRPC's own lines went to stderr in
// Go's log format, plain text among the JSON; through GRPC they are the
// binary's, its errors shown at info and its info and warnings at debug.
func TestGRPCsLinesAreTheBinarysFormat(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	g := GRPC(l.With(KeyComponent, "grpc"))
	g.Infof("connecting to %s", "a")
	g.Warningln("slow", 2)
	g.Errorf("transport: %s", "broken\nline")
	if g.V(2) {
		t.Error("verbose lines shown at info")
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("not one JSON line: %v\n%s", err, buf.String())
	}
	if got["level"] != "ERROR" || got["msg"] != "transport: broken\nline" || got[KeyComponent] != "grpc" {
		t.Fatalf("gRPC's error line: %v", got)
	}
	buf.Reset()
	l, _ = New(&buf, "json", "debug")
	g = GRPC(l)
	g.Warningln("slow", 2)
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil || got["level"] != "DEBUG" || got["msg"] != "slow 2" || !g.V(2) {
		t.Fatalf("gRPC's warning at debug: %v %v", got, err)
	}
}
