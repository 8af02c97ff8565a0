package framed

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/logging"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// TLS, when set, is the port's TLS: a connection's preface must ask for
	// it. Nil: plaintext.
	TLS *tls.Config
	// Codec decodes the agent's messages into what the handler's RecvMsg
	// asks for, as gRPC's server codec would (the ingest port's pools its
	// batches); nil: gRPC's protobuf codec.
	Codec encoding.CodecV2
	// MaxMessage is the largest message read (DefaultMaxMessage when 0).
	MaxMessage int
	// Pool gives the buffers messages are read into (gRPC's default pool
	// when nil, as its server's).
	Pool mem.BufferPool
	// Handshake bounds the preface, the TLS handshake and the token.
	Handshake time.Duration
	// Idle is the most a connection may send nothing (an agent sends a
	// batch, or a heartbeat, at least every 10 s): past it the stream ends,
	// as gRPC's keepalive ends a connection whose peer is gone.
	Idle time.Duration
	// MaxAge, when set: a stream past it ends at its next message,
	// Unavailable (the agent reconnects, with its current token), as
	// gRPC's MaxConnectionAge ends a connection.
	MaxAge time.Duration
	// WriteTimeout bounds each write (a welcome, an ack, the status).
	WriteTimeout time.Duration
	Log          *slog.Logger
}

// Server serves framed connections with one handler, the ingest server's
// Report: it sees a framed stream as it sees a gRPC one.
type Server struct {
	o       ServerOptions
	handler func(pulsev1.Ingest_ReportServer) error
	base    context.Context
	cancel  context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server running handler for each connection.
func NewServer(handler func(pulsev1.Ingest_ReportServer) error, o ServerOptions) *Server {
	if o.Codec == nil {
		o.Codec = encoding.GetCodecV2(gproto.Name)
	}
	if o.MaxMessage <= 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	if o.Pool == nil {
		o.Pool = mem.DefaultBufferPool()
	}
	if o.Handshake <= 0 {
		o.Handshake = 10 * time.Second
	}
	if o.Idle <= 0 {
		o.Idle = time.Minute
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	base, cancel := context.WithCancel(context.Background())
	return &Server{o: o, handler: handler, base: base, cancel: cancel, conns: map[net.Conn]struct{}{}}
}

// track notes c as served; false once the server is closed.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c net.Conn) {
	_ = c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Close closes every connection served and waits for their handlers; a
// connection served after is closed at once.
func (s *Server) Close() {
	// The streams' context first: a read the close below ends sees that
	// the server is closing (Canceled), not a connection that failed.
	s.cancel()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// ServeConn serves c, a connection whose first byte is FirstByte, until its
// stream ends; it closes c. Its handshake has o.Handshake from now.
func (s *Server) ServeConn(c net.Conn) { s.ServeConnBy(c, time.Time{}) }

// ServeConnBy is ServeConn with the handshake due by a time (zero: o.Handshake
// from now): a port that waited for the connection's first byte passes the
// handshake's deadline that wait began, so that a peer's first byte at the
// end of the wait buys it no second one.
func (s *Server) ServeConnBy(c net.Conn, by time.Time) {
	if !s.track(c) {
		_ = c.Close()
		return
	}
	defer s.untrack(c)
	ctx, cancel := context.WithCancel(s.base)
	defer cancel()
	st := s.open(ctx, c, by)
	if st == nil {
		return
	}
	herr := s.handler(st)
	if !st.broken {
		_ = writeStatus(st.conn, herr, st.s.o.WriteTimeout)
	}
}

// open makes c's handshake, due by by (zero: o.Handshake from now), and is
// its stream (nil when the handshake failed). Apart from ServeConnBy, so
// that what the handshake needs is not on the stack of a stream waiting
// for its next message, which every GC scans.
func (s *Server) open(ctx context.Context, c net.Conn, by time.Time) *serverStream {
	if by.IsZero() {
		by = time.Now().Add(s.o.Handshake)
	}
	conn, token, err := s.handshake(ctx, c, by)
	if err != nil {
		s.o.Log.Debug("framed connection refused", logging.KeyAddr, c.RemoteAddr().String(), logging.KeyErr, err)
		return nil
	}
	md := metadata.MD{}
	if token != "" {
		md.Set("authorization", "Bearer "+token)
	}
	ctx = metadata.NewIncomingContext(ctx, md)
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: c.RemoteAddr(), LocalAddr: c.LocalAddr()})
	st := &serverStream{s: s, conn: conn, ctx: ctx}
	st.ready, _ = conn.(readyReader)
	if s.o.MaxAge > 0 {
		st.until = time.Now().Add(jitter(s.o.MaxAge))
	}
	return st
}

// jitter is age ± 10 % at random, as gRPC's MaxConnectionAge is: the
// streams a replica took at its start (every agent's, within seconds) do
// not all end, and reconnect with their token reviews and catalogues, at
// the same moment every MaxAge.
func jitter(age time.Duration) time.Duration {
	spread := int64(age / 5)
	if spread <= 0 {
		return age
	}
	return age - age/10 + time.Duration(rand.Int64N(spread+1)) //nolint:gosec // G404: a spread of reconnects, not a secret
}

// handshake reads the preface (answering it), makes the TLS handshake the
// preface asks for, and reads the token: by the time given.
func (s *Server) handshake(ctx context.Context, c net.Conn, by time.Time) (net.Conn, string, error) {
	_ = c.SetDeadline(by)
	var pre [prefaceLen]byte
	if _, err := io.ReadFull(c, pre[:]); err != nil {
		return nil, "", err
	}
	var refuse error
	switch p := string(pre[:]); {
	case p == PrefaceTLS && s.o.TLS == nil:
		refuse = status.Error(codes.FailedPrecondition, "this ingest port serves plaintext, and the agent asks for TLS: drop --aggregator-ca-file, or serve the port with TLS")
	case p == PrefaceTCP && s.o.TLS != nil:
		refuse = status.Error(codes.FailedPrecondition, "this ingest port serves TLS: the agent must connect with --aggregator-ca-file")
	case p != PrefaceTLS && p != PrefaceTCP:
		refuse = status.Error(codes.InvalidArgument, prefaceError(pre[:]).Error())
	}
	if refuse != nil {
		_ = writeStatus(c, refuse, s.o.WriteTimeout)
		return nil, "", refuse
	}
	if err := writeFrame(c, kindAccept, nil); err != nil {
		return nil, "", err
	}
	conn := c
	if s.o.TLS != nil {
		tc := tls.Server(c, s.o.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, "", err
		}
		conn = tc
	}
	var h [headerLen]byte
	kind, n, err := readHeader(conn, &h)
	var huge errHugeFrame
	switch {
	case errors.As(err, &huge):
		// Past every bound: answered as one past the token's (a token
		// of 2^31 bytes or more went unanswered, the connection closed).
		err = tokenOrKind(kind, int64(huge))
	case err != nil:
		return nil, "", err
	default:
		err = tokenOrKind(kind, int64(n))
	}
	if err != nil {
		_ = writeStatus(conn, err, s.o.WriteTimeout)
		return nil, "", err
	}
	token := make([]byte, n)
	if _, err := io.ReadFull(conn, token); err != nil {
		return nil, "", err
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, string(token), nil
}

// serverStream is one framed connection's stream, as the handler sees a
// gRPC one. Only the handler's goroutine uses it.
type serverStream struct {
	s     *Server
	conn  net.Conn
	ctx   context.Context
	until time.Time // past it, the next message ends the stream (zero: never)
	hdr   [headerLen]byte
	// ready reads conn on ready (nil where it cannot: TLS, a connection
	// not netbound.Ready wrapped); pending is what its last read took past
	// the message it ended (nil almost always: an agent sends a message
	// and waits).
	ready   readyReader
	pending []byte
	// broken: a write failed, perhaps within a frame; no status follows
	// it (the agent would read the status's bytes as the rest of the
	// frame, a message made up, or an error that is not the stream's).
	broken bool
}

// readyReader is a connection that waits until its socket is readable
// before it takes a buffer from pool and reads into it (netbound.Ready's).
type readyReader interface {
	ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error)
}

var _ pulsev1.Ingest_ReportServer = (*serverStream)(nil)

func (st *serverStream) Context() context.Context                { return st.ctx }
func (st *serverStream) SetHeader(metadata.MD) error             { return nil }
func (st *serverStream) SendHeader(metadata.MD) error            { return nil }
func (st *serverStream) SetTrailer(metadata.MD)                  {}
func (st *serverStream) Send(m *pulsev1.AggregatorMessage) error { return st.SendMsg(m) }

// SendMsg writes m as one frame, within the write timeout.
func (st *serverStream) SendMsg(m any) error {
	data, err := st.s.o.Codec.Marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "framed: encode a message: %v", err)
	}
	defer data.Free()
	var h [headerLen]byte
	header(&h, kindMessage, data.Len())
	buf := make([]byte, 0, headerLen+data.Len())
	buf = append(buf, h[:]...)
	for _, b := range data {
		buf = append(buf, b.ReadOnlyData()...)
	}
	_ = st.conn.SetWriteDeadline(time.Now().Add(st.s.o.WriteTimeout))
	if _, err := st.conn.Write(buf); err != nil {
		st.broken = true
		return status.Errorf(codes.Unavailable, "framed: write to the agent: %v", err)
	}
	return nil
}

func (st *serverStream) Recv() (*pulsev1.AgentMessage, error) {
	m := new(pulsev1.AgentMessage)
	if err := st.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// RecvMsg reads the next message into m: io.EOF at the agent's half-close
// (or close) between two messages. Its payload is read as it arrives, in
// pooled pieces of at most readPiece bytes: a header alone holds no more
// than a piece, whatever length it declares (up to MaxMessage), where one
// buffer of the declared length held up to 4 MiB a connection for a
// 5-byte header until the idle bound.
//
// It waits for the header in a frame of its own, and reads the payload in
// another (payload): a stream waits here between its batches, and every
// GC scans its stack while it does.
//
// A connection that reads on ready (the ingest port's plaintext ones:
// netbound.Ready) is read in one read(2) of up to readAhead bytes, into a
// pooled buffer taken once the socket is readable: the header and, almost
// always, the whole message with it. Read as a header and then a payload,
// each message took three read(2)s (the one that found nothing yet, the
// header's, the payload's); now two, a fifth fewer system calls in all
// (docs/performance.md, "A message in one read").
func (st *serverStream) RecvMsg(m any) error {
	// The write deadline too: with TLS a read may write (crypto/tls
	// answers a key update from within Read), and a write with no
	// deadline to a peer that reads nothing blocked for ever.
	_ = st.conn.SetDeadline(time.Now().Add(st.s.o.Idle))
	if st.ready != nil {
		return st.recvReady(m)
	}
	kind, n, err := readHeader(st.conn, &st.hdr)
	if err := st.header(kind, n, err); err != nil {
		return err
	}
	return st.payload(n, m, nil, nil)
}

// recvReady is RecvMsg's read on ready: what the last read took past its
// message first, else one read once the socket is readable.
func (st *serverStream) recvReady(m any) error {
	if data := st.pending; len(data) > 0 {
		st.pending = nil
		return st.frame(nil, data, m)
	}
	buf, n, err := st.ready.ReadOnReady(readAhead, st.s.o.Pool)
	if err != nil {
		return st.header(0, 0, err)
	}
	return st.frame(buf, (*buf)[:n], m)
}

// frame takes the message that begins data, read into buf (pooled; nil:
// data is pending bytes): what of its header and payload data lacks is
// read from the connection, and what data holds past it is kept for the
// next. Never inlined, so that its frame is not on the stack of a stream
// waiting for its next message.
//
//go:noinline
func (st *serverStream) frame(buf *[]byte, data []byte, m any) error {
	pool := st.s.o.Pool
	k := copy(st.hdr[:], data)
	data = data[k:]
	if k < headerLen {
		// The header split between reads (a read ends where the bytes
		// that have come end): the rest of it from the connection.
		if buf != nil {
			pool.Put(buf)
			buf = nil
		}
		if _, err := io.ReadFull(st.conn, st.hdr[k:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // within the header
			}
			return st.header(0, 0, err)
		}
	}
	kind, n, err := parseHeader(&st.hdr)
	if err := st.header(kind, n, err); err != nil {
		if buf != nil {
			pool.Put(buf)
		}
		return err
	}
	if len(data) < n {
		return st.payload(n, m, data, buf)
	}
	if rest := data[n:]; len(rest) > 0 {
		if buf != nil {
			rest = bytes.Clone(rest) // the pool's buffer goes back below
		}
		// Pending bytes are the stream's own: the rest of them stays
		// where it is (cloned at each message, a read of many small
		// messages was copied once a message, quadratically).
		st.pending = rest
	}
	err = st.unmarshal(mem.BufferSlice{mem.SliceBuffer(data[:n])}, m)
	if buf != nil {
		pool.Put(buf)
	}
	return err
}

// header is the refusal of a message's header as readHeader read it (nil
// when it is taken).
func (st *serverStream) header(kind byte, n int, err error) error {
	var huge errHugeFrame
	switch {
	case errors.Is(err, io.EOF):
		return io.EOF
	case errors.As(err, &huge):
		// The frame's kind first, as for any other (a huge frame of the
		// wrong kind was answered as a message too large).
		if kind != kindMessage {
			return errFrameKind(kind, "a message")
		}
		return errTooLarge(int64(huge), st.s.o.MaxMessage)
	case err != nil:
		return st.readFailed(err)
	case kind != kindMessage:
		return errFrameKind(kind, "a message")
	case n > st.s.o.MaxMessage:
		return errTooLarge(int64(n), st.s.o.MaxMessage)
	case !st.until.IsZero() && time.Now().After(st.until):
		return status.Errorf(codes.Unavailable, "framed: the connection is past its age (%s): reconnect", st.s.o.MaxAge)
	}
	return nil
}

// readFailed is a failed read's refusal: Canceled once Close has
// cancelled the streams' context (its close of the connection is what
// failed the read, within a header or a payload), Unavailable otherwise.
func (st *serverStream) readFailed(err error) error {
	if st.ctx.Err() != nil {
		return status.Error(codes.Canceled, "framed: the server is closing")
	}
	return status.Errorf(codes.Unavailable, "framed: read from the agent: %v", err)
}

// payload reads a message's n bytes, of which it has the first (read
// with its header into held, a pooled buffer given back once they are
// copied: nil when none), and unmarshals them into m.
func (st *serverStream) payload(n int, m any, have []byte, held *[]byte) error {
	pool := st.s.o.Pool
	var (
		one  [1]*[]byte
		bufs = one[:0]
		data mem.BufferSlice
	)
	// The codec keeps nothing of the bytes (gRPC frees them after it too):
	// the pieces go back to the pool whatever their size.
	defer func() {
		if held != nil {
			pool.Put(held)
		}
		for _, b := range bufs {
			pool.Put(b)
		}
	}()
	for left := n; left > 0; {
		buf := pool.Get(min(left, readPiece))
		bufs = append(bufs, buf)
		data = append(data, mem.SliceBuffer(*buf))
		k := copy(*buf, have)
		if have = have[k:]; len(have) == 0 && held != nil {
			pool.Put(held) // copied: not held while the rest comes
			held = nil
		}
		if _, err := io.ReadFull(st.conn, (*buf)[k:]); err != nil {
			return st.readFailed(err)
		}
		left -= len(*buf)
	}
	return st.unmarshal(data, m)
}

// unmarshal decodes a message's payload into m.
func (st *serverStream) unmarshal(data mem.BufferSlice, m any) error {
	if err := st.s.o.Codec.Unmarshal(data, m); err != nil {
		return status.Errorf(codes.Internal, "framed: failed to unmarshal the received message: %v", err)
	}
	return nil
}

// readAhead is the most one read on ready takes: a batch of a node's pods
// (a few hundred bytes) with its header, in one buffer of the pool's
// smallest size past them.
const readAhead = 4 << 10

// readPiece is the most of a message's payload read into one buffer: a
// batch of a node's pods is a few hundred bytes, in one piece; a larger
// message is read in pieces as its bytes come.
const readPiece = 32 << 10

// tokenOrKind is the refusal of a first frame of kind declaring n bytes
// where the token belongs: of the wrong kind, or past maxToken (nil when
// neither).
func tokenOrKind(kind byte, n int64) error {
	switch {
	case kind != kindToken:
		return errFrameKind(kind, "the token")
	case n > maxToken:
		return status.Errorf(codes.InvalidArgument, "framed: a token of %d bytes; at most %d", n, maxToken)
	}
	return nil
}
