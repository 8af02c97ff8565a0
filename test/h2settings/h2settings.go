// Package h2settings reads the settings an HTTP/2 server (a gRPC port)
// announces to a new connection, for tests of the bounds they carry.
package h2settings

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Dial connects to addr (retrying for up to 10 s while nothing listens),
// says HTTP/2's preface and its own settings, and returns the framer; the
// connection is closed when the test ends, and has 10 s to do its work.
func Dial(t testing.TB, addr string) *http2.Framer {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var c net.Conn
	for {
		var err error
		if c, err = net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return fr
}

// Read reads the first SETTINGS frame of the server at addr (Dial's).
func Read(t testing.TB, addr string) *http2.SettingsFrame {
	t.Helper()
	f, err := Dial(t, addr).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("%s's first frame %v: want its SETTINGS", addr, f)
	}
	return sf
}

// Expect fails t for each setting of want the frame does not announce with
// that value.
func Expect(t testing.TB, sf *http2.SettingsFrame, want map[http2.SettingID]uint32) {
	t.Helper()
	for id, w := range want {
		if v, ok := sf.Value(id); !ok || v != w {
			t.Errorf("%v: %d (announced: %v); want %d", id, v, ok, w)
		}
	}
}
