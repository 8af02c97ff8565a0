// Package framed carries an agent's ingest stream on a TCP connection of its
// own, as length-prefixed protobuf frames, with no HTTP/2 under it: the
// aggregator reads each agent's connection in place, in one goroutine that
// is also the stream's handler.
//
// gRPC holds, for each agent's connection, an HTTP/2 transport (its framer,
// HPACK tables, control buffer, flow-control state and keepalive timers) and
// four goroutines (the transport's reader, its writer, its keepalive and the
// stream's handler), and hands every message from the reader to the handler:
// about 10 KB of heap and four stacks a connection on a fleet's aggregator
// (docs/performance.md, "The framed transport", measures both). An
// agent's stream is one
// request stream a connection, a batch a second and an ack every 10 s: this
// transport carries the same messages (proto/pulse/v1, the same Ingest.Report
// handler on the aggregator) with none of that.
//
// The protocol (docs/protocol.md, "The framed transport"):
//   - The agent opens a TCP connection to the aggregator's ingest port and
//     writes a preface, "pulse-framed/1 tcp\n" or "pulse-framed/1 tls\n"
//     (whether it will speak TLS). The port tells it from gRPC's by its
//     first byte (HTTP/2's preface begins "PRI", a TLS handshake 0x16).
//   - The aggregator answers with an accept frame, or a status frame and
//     the connection's close when the preface is not one it serves (TLS
//     asked of a plaintext port, or the other way).
//   - With "tls", a TLS handshake follows, the agent the client; every byte
//     after it is inside TLS.
//   - The agent's first frame is its token (empty: none), then its
//     messages. The aggregator's are messages, and a status frame last.
//   - A frame is its kind (one byte), its payload's length (four bytes, big
//     endian) and the payload. A message's payload is the protobuf of an
//     AgentMessage or an AggregatorMessage; a status's, a google.rpc.Status.
//   - The agent's half-close (TCP's FIN, or TLS's close_notify) ends its
//     side as gRPC's CloseSend does.
package framed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The prefaces an agent opens its connection with.
const (
	PrefaceTCP = "pulse-framed/1 tcp\n"
	PrefaceTLS = "pulse-framed/1 tls\n"
	prefaceLen = len(PrefaceTCP)
)

// FirstByte is the first byte of both prefaces: a port that serves gRPC
// too tells a framed connection by it.
const FirstByte = 'p'

// Frame kinds.
const (
	kindToken   byte = 1 // agent: its bearer token, the first frame
	kindMessage byte = 2 // both: a message's protobuf
	kindStatus  byte = 3 // aggregator: the stream's end, a google.rpc.Status
	kindAccept  byte = 4 // aggregator: the preface is served (empty)
)

const headerLen = 5

// Bounds on what a peer may send.
const (
	// DefaultMaxMessage is the largest message read, as gRPC's default
	// receive size on the ingest port.
	DefaultMaxMessage = 4 << 20
	// maxToken: a projected ServiceAccount token is about 1 KB.
	maxToken = 16 << 10
	// maxStatus bounds a status frame read by an agent.
	maxStatus = 64 << 10
)

// header encodes a frame's header.
func header(b *[headerLen]byte, kind byte, n int) {
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], uint32(n))
}

// writeFrame writes one frame in one write.
func writeFrame(w io.Writer, kind byte, payload []byte) error {
	buf := make([]byte, headerLen+len(payload))
	header((*[headerLen]byte)(buf), kind, len(payload))
	copy(buf[headerLen:], payload)
	_, err := w.Write(buf)
	return err
}

// readHeader reads a frame's header into b: io.EOF when the connection
// ended before it, io.ErrUnexpectedEOF within it, an errHugeFrame (the
// header read, its kind returned) when it declares more than maxFrame.
func readHeader(r io.Reader, b *[headerLen]byte) (kind byte, n int, err error) {
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, err
	}
	return parseHeader(b)
}

// parseHeader is the kind and length a header read into b declares (an
// errHugeFrame, with its kind, past maxFrame).
func parseHeader(b *[headerLen]byte) (kind byte, n int, err error) {
	v := binary.BigEndian.Uint32(b[1:])
	if v > maxFrame {
		return b[0], 0, errHugeFrame(v)
	}
	return b[0], int(v), nil
}

// maxFrame is the most a frame's header may declare: an int on every
// platform. A length of 2^31 or more was a negative int on a 32-bit one,
// past every bound's check: the token's allocation panicked before any
// authentication, and a message's payload went unread.
const maxFrame = math.MaxInt32

// errHugeFrame: a header declaring v bytes, past maxFrame.
type errHugeFrame uint32

func (e errHugeFrame) Error() string {
	return fmt.Sprintf("framed: a frame declares %d bytes; at most %d", uint32(e), maxFrame)
}

// GRPCStatus: ResourceExhausted, as a message past the bound is.
func (e errHugeFrame) GRPCStatus() *status.Status {
	return status.New(codes.ResourceExhausted, e.Error())
}

// statusPayload is err's google.rpc.Status (codes.OK for nil).
func statusPayload(err error) []byte {
	st, _ := status.FromError(err)
	if err != nil && st.Code() == codes.OK {
		st = status.New(codes.Unknown, err.Error())
	}
	b, merr := proto.Marshal(st.Proto())
	if merr != nil {
		b, _ = proto.Marshal(status.New(codes.Internal, "the stream's status could not be encoded").Proto())
	}
	return b
}

// writeStatus ends a stream with err's status, within timeout.
func writeStatus(c net.Conn, err error, timeout time.Duration) error {
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	return writeFrame(c, kindStatus, statusPayload(err))
}

// readStatus decodes a status frame's payload: nil for OK.
func readStatus(payload []byte) error {
	var st spb.Status
	if err := proto.Unmarshal(payload, &st); err != nil {
		return status.Errorf(codes.Internal, "the aggregator's status frame does not decode: %v", err)
	}
	if codes.Code(st.GetCode()) == codes.OK {
		return nil
	}
	return status.ErrorProto(&st)
}

// errFrameKind is a frame of a kind that does not belong where it came.
func errFrameKind(kind byte, want string) error {
	return status.Errorf(codes.InvalidArgument, "framed: a frame of kind %d where %s belongs", kind, want)
}

// errTooLarge is gRPC's own answer to a message past the receive size.
func errTooLarge(n int64, most int) error {
	return status.Errorf(codes.ResourceExhausted, "framed: received message larger than max (%d vs. %d)", n, most)
}

// ErrPreface: a connection that began with the framed transport's first
// byte sent no preface of it.
var ErrPreface = errors.New("not a pulse-framed/1 preface")

func prefaceError(got []byte) error {
	return fmt.Errorf("%w: %q", ErrPreface, got)
}
