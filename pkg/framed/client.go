package framed

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// TLS, when set, is the connection's TLS (the aggregator's name and CA
	// in it). Nil: plaintext.
	TLS *tls.Config
	// Token, when set, is read at each connect: the bearer token the
	// stream sends (the agent's ServiceAccount token, re-read as it
	// rotates). It needs TLS.
	Token func() (string, error)
	// Dial opens the TCP connection (net.Dialer's when nil).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// ConnectTimeout bounds the connection, the preface's answer, the TLS
	// handshake and the token (10 s when 0).
	ConnectTimeout time.Duration
	// Fallback, when set, carries a stream whose aggregator does not speak
	// the framed transport (one of a version before it, serving gRPC
	// alone): Report opens the stream on it instead (a gRPC client of the
	// same address), and OnFallback, when set, is told why. Each Report
	// tries the framed transport first, so that an aggregator upgraded
	// since is used framed at the next stream. Nil: such a Report fails
	// with FailedPrecondition.
	Fallback   pulsev1.IngestClient
	OnFallback func(error)
}

// notFramed is a handshake's error when the peer answered the preface as
// something other than a framed aggregator: with HTTP/2's settings (a
// gRPC-only port in plaintext), or by closing the connection (one serving
// TLS, which read the preface as a bad TLS record).
type notFramed struct{ msg string }

func (e *notFramed) Error() string { return e.msg }

// Client opens framed streams to one aggregator address. It is a
// pulsev1.IngestClient: the agent's stream code runs on it as on gRPC's.
type Client struct {
	addr string
	o    ClientOptions
}

var _ pulsev1.IngestClient = (*Client)(nil)

// NewClient returns a client of the aggregator at addr (host:port, its
// ingest port); it connects at each Report.
func NewClient(addr string, o ClientOptions) (*Client, error) {
	if o.Token != nil && o.TLS == nil {
		return nil, errors.New("framed: a token needs TLS")
	}
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	return &Client{addr: addr, o: o}, nil
}

// Report opens a stream on a new connection. Its errors are statuses, as
// gRPC's are: Unavailable when the aggregator cannot be reached.
func (c *Client) Report(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage], error) {
	token := ""
	if c.o.Token != nil {
		t, err := c.o.Token()
		if err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		token = t
	}
	hctx, cancel := context.WithTimeout(ctx, c.o.ConnectTimeout)
	defer cancel()
	raw, err := c.o.Dial(hctx, "tcp", c.addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "framed: connect to %s: %v", c.addr, err)
	}
	conn, err := c.handshake(hctx, raw, token)
	if err != nil {
		_ = raw.Close()
		var nf *notFramed
		if errors.As(err, &nf) {
			if c.o.Fallback != nil {
				if c.o.OnFallback != nil {
					c.o.OnFallback(err)
				}
				return c.o.Fallback.Report(ctx, opts...)
			}
			return nil, status.Error(codes.FailedPrecondition, nf.msg)
		}
		if s, ok := status.FromError(err); ok {
			return nil, s.Err()
		}
		return nil, status.Errorf(codes.Unavailable, "framed: connect to %s: %v", c.addr, err)
	}
	cs := &clientStream{conn: conn, ctx: ctx}
	cs.stop = context.AfterFunc(ctx, func() { _ = conn.Close() })
	return cs, nil
}

// handshake writes the preface, reads its answer, makes the TLS handshake
// and sends the token, within ctx's deadline.
func (c *Client) handshake(ctx context.Context, raw net.Conn, token string) (net.Conn, error) {
	if d, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	pre := PrefaceTCP
	if c.o.TLS != nil {
		pre = PrefaceTLS
	}
	if _, err := io.WriteString(raw, pre); err != nil {
		return nil, err
	}
	var h [headerLen]byte
	kind, n, err := readHeader(raw, &h)
	switch {
	case closedEarly(err) && c.o.TLS != nil:
		// An aggregator of a version before the framed transport that
		// serves TLS reads the preface as a bad TLS record, and closes. So
		// does one of this version that refuses the connection (past its
		// connections from an address, or shutting down), which the gRPC
		// stream tried instead meets too. In plaintext an older one answers
		// with its settings (below): a close there is no sign of one.
		return nil, &notFramed{fmt.Sprintf("framed: %s closed the connection at the framed transport's preface (%v): an aggregator older than it (it serves --transport=grpc only), or one refusing the connection (past --max-ingest-connections-per-address, or shutting down)", c.addr, err)}
	case err != nil && !errors.As(err, new(errHugeFrame)):
		return nil, fmt.Errorf("no answer to the framed transport's preface: %w", err)
	case err == nil && kind == kindStatus && n <= maxStatus:
		p := make([]byte, n)
		if _, err := io.ReadFull(raw, p); err != nil {
			return nil, fmt.Errorf("the preface's answer: %w", err)
		}
		if err := readStatus(p); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Internal, "framed: the aggregator ended the connection at its preface")
	case err != nil || kind != kindAccept || n != 0:
		// An aggregator of a version before the framed transport answers as
		// the HTTP/2 server it is: with its settings frame.
		return nil, &notFramed{fmt.Sprintf("framed: %s does not speak the framed transport (its answer to the preface began %x): an aggregator older than it serves --transport=grpc only", c.addr, h[:])}
	}
	conn := raw
	if c.o.TLS != nil {
		tc := tls.Client(raw, c.o.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		conn = tc
	}
	if err := writeFrame(conn, kindToken, []byte(token)); err != nil {
		return nil, err
	}
	if !stop() { // ctx ended: the deadline is past already
		return nil, ctx.Err()
	}
	_ = raw.SetDeadline(time.Time{})
	return conn, nil
}

// closedEarly says that err is the peer closing the connection (not a
// timeout, which says nothing of what it speaks).
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// clientStream is one framed stream, as the agent sees a gRPC one. One
// goroutine may send while another receives.
type clientStream struct {
	conn net.Conn
	ctx  context.Context
	stop func() bool
	hdr  [headerLen]byte
}

func (cs *clientStream) Header() (metadata.MD, error) { return nil, nil }
func (cs *clientStream) Trailer() metadata.MD         { return nil }
func (cs *clientStream) Context() context.Context     { return cs.ctx }

// CloseSend half-closes the connection: the aggregator's handler reads
// io.EOF after the messages sent.
func (cs *clientStream) CloseSend() error {
	if cw, ok := cs.conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (cs *clientStream) Send(m *pulsev1.AgentMessage) error { return cs.SendMsg(m) }

// SendMsg writes m (a protobuf message) as one frame. A write that fails
// returns io.EOF, as gRPC's SendMsg does for a stream that ended, and leaves
// the connection to RecvMsg: the aggregator's status (Unauthenticated, its
// bounds) may be there to read, and closing the connection here lost it
// to "use of closed network connection". The stream's context's end closes
// it too.
func (cs *clientStream) SendMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "framed: %T is not a protobuf message", m)
	}
	buf := make([]byte, headerLen, headerLen+proto.Size(pm))
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, pm)
	if err != nil {
		return status.Errorf(codes.Internal, "framed: encode a message: %v", err)
	}
	header((*[headerLen]byte)(buf), kindMessage, len(buf)-headerLen)
	if _, err := cs.conn.Write(buf); err != nil {
		if cs.ctx.Err() != nil {
			return cs.ended(err)
		}
		return io.EOF
	}
	return nil
}

func (cs *clientStream) Recv() (*pulsev1.AggregatorMessage, error) {
	m := new(pulsev1.AggregatorMessage)
	if err := cs.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// RecvMsg reads the next message into m: io.EOF when the aggregator ended
// the stream with OK, its status's error otherwise.
func (cs *clientStream) RecvMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "framed: %T is not a protobuf message", m)
	}
	kind, n, err := readHeader(cs.conn, &cs.hdr)
	if err != nil {
		return cs.ended(err)
	}
	switch {
	case kind == kindStatus && n > maxStatus:
		return cs.ended(errTooLarge(int64(n), maxStatus))
	case kind == kindMessage && n > DefaultMaxMessage:
		return cs.ended(errTooLarge(int64(n), DefaultMaxMessage))
	case kind != kindStatus && kind != kindMessage:
		return cs.ended(errFrameKind(kind, "a message or the status"))
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(cs.conn, payload); err != nil {
		return cs.ended(err)
	}
	if kind == kindStatus {
		cs.stop()
		_ = cs.conn.Close()
		if err := readStatus(payload); err != nil {
			return err
		}
		return io.EOF
	}
	if err := proto.Unmarshal(payload, pm); err != nil {
		return cs.ended(status.Errorf(codes.Internal, "framed: failed to unmarshal the received message: %v", err))
	}
	return nil
}

// ended closes the connection and says why the stream ended: the
// context's end when it did (Canceled, DeadlineExceeded), a status as it
// is, Unavailable for the connection's own failure.
func (cs *clientStream) ended(err error) error {
	cs.stop()
	_ = cs.conn.Close()
	if cerr := cs.ctx.Err(); cerr != nil {
		return status.FromContextError(cerr).Err()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, io.EOF) {
		return status.Error(codes.Unavailable, "framed: the aggregator closed the connection with no status")
	}
	return status.Errorf(codes.Unavailable, "framed: %v", err)
}
