package netbound

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestConnectionsAreBounded: past its bound from one address a connection
// is closed at once, another address is still served, and a connection
// closed gives its room back.
func TestConnectionsAreBounded(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(raw, 3, 2)
	defer func() { _ = l.Close() }()
	// Each refusal says whose bound it was: the address's share, or the
	// port's in all (the aggregator's log named the per-address flag for
	// both).
	refusals := make(chan string, 16)
	l.OnRefuse = func(ip string, all bool) { refusals <- fmt.Sprintf("%s all=%v", ip, all) }
	refused := func(want string) {
		t.Helper()
		select {
		case got := <-refusals:
			if got != want {
				t.Fatalf("refused %s, want %s", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no refusal told; want %s", want)
		}
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	held := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); l.Held() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections held, want %d", l.Held(), want)
			}
		}
	}
	// closed: the listener closed c (EOF or a reset), not a read that
	// timed out on a connection held and silent.
	closed := func(c net.Conn, what string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: read %v, want it closed", what, err)
		}
	}
	a1, a2 := dial("127.0.0.1"), dial("127.0.0.1")
	held(2)
	a3 := dial("127.0.0.1") // past 2 from one address: closed by the listener
	closed(a3, "a third connection from one address")
	refused("127.0.0.1 all=false")
	b1 := dial("127.0.0.2")
	held(3)
	b2 := dial("127.0.0.2") // past 3 in all
	closed(b2, "a fourth connection")
	refused("127.0.0.2 all=true")
	_ = (<-accepted).Close()
	held(2)
	b3 := dial("127.0.0.2") // room again
	held(3)
	for _, c := range []net.Conn{a1, a2, a3, b1, b2, b3} {
		_ = c.Close()
	}
}

// bounded is a Listener on loopback of the bounds given, closed at the
// test's end, and a function that dials it and accepts the connection.
func bounded(t *testing.T, maxAll, maxIP int) (*Listener, func() *Conn) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(raw, maxAll, maxIP)
	t.Cleanup(func() { _ = l.Close() })
	return l, func() *Conn {
		t.Helper()
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return s.(*Conn)
	}
}

// TestAnExemptConnectionLeavesItsAddressesBound: a connection exempted
// (an authenticated client's, Conn.Exempt) gives back its place among its
// address's and keeps its place in all; its Close then gives back that
// alone, and an Exempt after Close or a second one changes nothing.
func TestAnExemptConnectionLeavesItsAddressesBound(t *testing.T) {
	l, accept := bounded(t, 3, 1)
	counts := func(what string, all, fromIP int) {
		t.Helper()
		if l.Held() != all || l.HeldFrom("127.0.0.1") != fromIP {
			t.Fatalf("%s: %d held, %d from the address; want %d and %d", what, l.Held(), l.HeldFrom("127.0.0.1"), all, fromIP)
		}
	}
	a := accept()
	a.Exempt()
	a.Exempt()
	counts("one exempt", 1, 0)
	b := accept() // within the address's bound of 1 again
	counts("one exempt, one bound", 2, 1)
	_ = a.Close()
	counts("the exempt closed", 1, 1)
	a.Exempt()
	_ = a.Close()
	counts("the exempt closed twice", 1, 1)
	_ = b.Close()
	b.Exempt()
	counts("both closed", 0, 0)
}

// TestAFullPortAsksForRoom: full in all, the listener asks Evict for room
// before it closes a new connection: one evicted gives its place to the
// new one; none evicted (Evict false), the new one is closed.
func TestAFullPortAsksForRoom(t *testing.T) {
	l, dialled := bounded(t, 2, 3)
	var held []net.Conn
	evict, asked := true, 0
	l.Evict = func() bool {
		asked++
		if !evict || len(held) == 0 {
			return false
		}
		_ = held[0].Close()
		held = held[1:]
		return true
	}
	accept := func() { held = append(held, dialled()) }
	accept()
	accept()
	if asked != 0 {
		t.Fatalf("Evict asked %d times with room, want 0", asked)
	}
	accept() // in the place of the first
	if asked != 1 || l.Held() != 2 {
		t.Fatalf("a third: Evict asked %d times, %d held; want 1 and 2", asked, l.Held())
	}
	evict = false
	refused := make(chan bool, 1)
	l.OnRefuse = func(_ string, all bool) { refused <- all }
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	go func() { _, _ = l.Accept() }()
	select {
	case all := <-refused:
		if !all || asked != 2 {
			t.Fatalf("a fourth, none evicted: refused (in all %v), Evict asked %d times; want in all and 2", all, asked)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a fourth, none evicted: not refused")
	}
}
