package main

import (
	"net"
	"sync"
)

// proxy forwards TCP connections to one upstream and can black-hole them:
// while partitioned it forwards nothing in either direction and closes
// nothing, so neither end hears from the other. It is not a network that
// drops packets: the loopback kernel still acknowledges what is written to
// the proxy, so TCP retransmission and TCP_USER_TIMEOUT never fire, and the
// ends learn of the partition by their gRPC keepalives only. Connections
// opened during the partition are accepted and then hear nothing. Heal lets
// everything through again, including what the proxy held (one 32 KiB read
// per direction; the rest waits in the kernel's socket buffers). Each
// connection reaches the upstream from its client's address.
type proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	cond    *sync.Cond
	blocked bool
	closed  bool
	conns   map[net.Conn]struct{}
}

func newProxy(upstream string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

// Addr is where clients connect.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Partition black-holes every connection, open or new.
func (p *proxy) Partition() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
}

// Heal forwards again.
func (p *proxy) Heal() {
	p.mu.Lock()
	p.blocked = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops listening and closes every connection.
func (p *proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed, p.blocked = true, false
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *proxy) serve(c net.Conn) {
	if !p.pass() {
		_ = c.Close()
		return
	}
	// From the client's own address, as a partition in a network leaves
	// each agent's: the aggregator holds a bounded number of connections
	// from one address, and the proxy's would otherwise all be 127.0.0.1's.
	var d net.Dialer
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		d.LocalAddr = &net.TCPAddr{IP: a.IP}
	}
	up, err := d.Dial("tcp", p.upstream)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.copy(up, c); done <- struct{}{} }()
	go func() { p.copy(c, up); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pass waits while partitioned; false when the proxy is closed.
func (p *proxy) pass() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.blocked {
		p.cond.Wait()
	}
	return !p.closed
}

// copy forwards src to dst, holding each chunk while partitioned.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// A close does not cross a partition either.
			p.pass()
			return
		}
	}
}
