package relay

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// rawAgent speaks HTTP/2 itself, so that it can stop within a message.
type rawAgent struct {
	t       *testing.T
	fr      *http2.Framer
	wmu     sync.Mutex
	mu      sync.Mutex
	cond    *sync.Cond
	connWin int
	strWin  int
	data    chan struct{} // a DATA frame of the relay's on stream 1
	ended   chan struct{} // stream 1 reset or ended by the relay
}

func dialRaw(t *testing.T, addr, upstream string) *rawAgent {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	a := &rawAgent{t: t, fr: http2.NewFramer(c, c), connWin: 65535, strWin: 65535, data: make(chan struct{}, 16), ended: make(chan struct{})}
	a.cond = sync.NewCond(&a.mu)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	_ = a.fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", reportMethod}, {":authority", "relay"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {UpstreamKey, upstream}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	go a.read()
	return a
}

func (a *rawAgent) read() {
	var once sync.Once
	for {
		f, err := a.fr.ReadFrame()
		if err != nil {
			once.Do(func() { close(a.ended) })
			a.cond.Broadcast()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				a.wmu.Lock()
				_ = a.fr.WriteSettingsAck()
				a.wmu.Unlock()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				a.wmu.Lock()
				_ = a.fr.WritePing(true, f.Data)
				a.wmu.Unlock()
			}
		case *http2.WindowUpdateFrame:
			a.mu.Lock()
			if f.StreamID == 0 {
				a.connWin += int(f.Increment)
			} else {
				a.strWin += int(f.Increment)
			}
			a.mu.Unlock()
			a.cond.Broadcast()
		case *http2.DataFrame:
			a.data <- struct{}{}
		case *http2.RSTStreamFrame:
			once.Do(func() { close(a.ended) })
			a.cond.Broadcast()
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				once.Do(func() { close(a.ended) })
			}
		}
	}
}

// send writes b on stream 1 as the windows allow.
func (a *rawAgent) send(b []byte) {
	for len(b) > 0 {
		a.mu.Lock()
		for a.connWin <= 0 || a.strWin <= 0 {
			select {
			case <-a.ended:
				a.mu.Unlock()
				return
			default:
			}
			a.cond.Wait()
		}
		n := min(len(b), a.connWin, a.strWin, 16<<10)
		a.connWin -= n
		a.strWin -= n
		a.mu.Unlock()
		a.wmu.Lock()
		err := a.fr.WriteData(1, false, b[:n])
		a.wmu.Unlock()
		if err != nil {
			return
		}
		b = b[n:]
	}
}

func framed(n int) []byte {
	h := make([]byte, 5)
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	return h
}

// TestAMessageBegunAndNotFinishedAfterTheWelcomeEndsTheStream: after its
// welcome an agent's stream declares a message of about 4 MiB and sends
// all of it but its last byte. The relay holds it (gRPC grows the stream's
// window to the declared length) for as long as the stream lives: the
// replica sees nothing of it and ends nothing, so the hello's bound
// (HelloWait) is the only one and it has passed: until the connection to
// the replica aged out, about an hour. The stream now ends within twice
// AgentSendWait of a message begun (an agent sends one at least every
// 10 s), counted as agent_not_sending.
func TestAMessageBegunAndNotFinishedAfterTheWelcomeEndsTheStream(t *testing.T) {
	agg := startAggregator(t, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	r, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d,
		HelloWait: time.Second, AgentSendWait: time.Second})
	a := dialRaw(t, at.addr, agg.addr)
	h, _ := proto.Marshal(hello("node-1"))
	a.send(append(framed(len(h)), h...))
	select {
	case <-a.data: // the welcome
	case <-time.After(5 * time.Second):
		t.Fatal("no welcome")
	}
	const n = 4<<20 - 64
	a.send(append(framed(n), make([]byte, n-1)...)) // all but the last byte
	select {
	case <-a.ended:
	case <-time.After(30 * time.Second):
		t.Fatalf("the stream is still forwarded 30 s after a message began that never ended (AgentSendWait %s)", time.Second)
	}
	if got := testutil.ToFloat64(r.m.refused.WithLabelValues("agent_not_sending")); got != 1 {
		t.Fatalf("refused for not sending: %v; want 1", got)
	}
}
