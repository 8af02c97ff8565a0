// Package httpflood opens many HTTP keep-alive connections from one
// address: the tests that a port holds a bounded number of them.
package httpflood

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Held opens n connections to addr from this address, each asking path
// once, and returns how many were answered (and held open after, by
// keep-alive), and release, which closes them all (the test's end does
// too).
func Held(t *testing.T, addr, path string, n int) (accepted int, release func()) {
	t.Helper()
	var conns []net.Conn
	release = func() {
		for _, c := range conns {
			_ = c.Close()
		}
		conns = nil
	}
	t.Cleanup(release)
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: pulse\r\n\r\n"); err != nil {
			continue
		}
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			_ = resp.Body.Close()
			accepted++
		}
	}
	return accepted, release
}

// GetFrom asks addr's path from another loopback address, 127.0.0.2, and
// returns the status (an error when no answer came).
func GetFrom(addr, path string) (int, error) {
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	resp, err := probe.Get("http://" + addr + path)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}
