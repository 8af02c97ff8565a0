package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/certs"
	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/framed"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/relay"
	"github.com/pulse-io/pulse/pkg/version"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// instance tells aggregators that this process's pod ids are new.
var instance = func() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}()

// ClientKeepalive pings an idle stream every 20s; the aggregator permits
// pings every 10s (see pkg/aggregator).
var ClientKeepalive = keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}

// streamer keeps one stream open to one aggregator address and sends it the
// catalogue and the samples.
type streamer struct {
	agent      *Agent
	addr       string
	serverName string // the name the aggregator's certificate must carry
	// relay: the agent's connection to --relay, shared by every
	// streamer (fanOut closes it); nil: the streamer dials the aggregator.
	relay *grpc.ClientConn

	mu      sync.Mutex
	pending map[string]result // by uid: the newest result not yet sent
	wake    chan struct{}

	// connected: a stream is open and welcomed (readiness reads it).
	connected atomic.Bool
	upAt      time.Time // when the stream was welcomed (the loop's own: open runs in it)
}

// An aggregator the agent cannot reach is reported, never waited on in
// silence: a warning once it has been unreachable for connectGrace, then at
// most every warnEvery while it stays so (each with the last reason).
const (
	connectGrace = 5 * time.Second
	warnEvery    = 30 * time.Second
)

// AckEvery is how often the agent asks the aggregator to acknowledge its
// batches (Hello.ack_every_ms): acks only feed pulse_agent_acked_batch_seq,
// and each one is a write and a wake-up on both ends of every stream.
const AckEvery = 10 * time.Second

// newStreamer streams to the aggregator at addr, through relay when it is
// not nil (the agent's connection to --relay).
func newStreamer(a *Agent, addr, serverName string, relay *grpc.ClientConn) *streamer {
	return &streamer{agent: a, addr: addr, serverName: serverName, relay: relay, pending: map[string]result{}, wake: make(chan struct{}, 1)}
}

func (s *streamer) offer(r result) {
	s.mu.Lock()
	s.pending[r.uid] = r
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// maxHeldMs: a held result older than this before a batch's newest is not
// sent (the aggregator's windows are at most minutes).
const maxHeldMs = 10 * 60 * 1000

// prune drops the held results of pods no longer listed: while an
// aggregator was unreachable, every pod ever scraped kept one, and with
// autoscaling's churn they grew for the outage's length, per replica.
func (s *streamer) prune(listed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid := range s.pending {
		if !listed[uid] {
			delete(s.pending, uid)
		}
	}
}

func (s *streamer) take() map[string]result {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.pending
	s.pending = make(map[string]result, len(out))
	return out
}

// run keeps a stream open until ctx ends, reconnecting with jittered
// exponential backoff.
func (s *streamer) run(ctx context.Context) {
	log := s.agent.log.With(logging.KeyAggregator, s.addr)
	// Through a relay, every replica's stream goes on the agent's one
	// connection to the relay (fanOut's), naming the replica.
	var client pulsev1.IngestClient
	switch conn := s.relay; {
	case conn != nil:
		client = pulsev1.NewIngestClient(conn)
	case s.agent.opts.Transport == TransportFramed || s.agent.opts.Transport == TransportAuto:
		var fallback pulsev1.IngestClient
		if s.agent.opts.Transport == TransportAuto {
			// gRPC's connection is made at its first stream: only for an
			// aggregator that does not speak the framed transport.
			c, err := s.agent.dial(s.addr, s.serverName)
			if err != nil {
				log.Error("aggregator address is not usable", logging.KeyErr, err)
				return
			}
			defer func() { _ = c.Close() }()
			fallback = pulsev1.NewIngestClient(c)
		}
		c, err := s.agent.framedClient(s.addr, s.serverName, fallback, func(err error) {
			log.Info("the aggregator does not speak the framed transport: this stream goes over gRPC", logging.KeyErr, err)
		})
		if err != nil {
			log.Error("aggregator address is not usable", logging.KeyErr, err)
			return
		}
		client = c
	default:
		c, err := s.agent.dial(s.addr, s.serverName)
		if err != nil {
			log.Error("aggregator address is not usable", logging.KeyErr, err)
			return
		}
		defer func() { _ = c.Close() }()
		client = pulsev1.NewIngestClient(c)
	}
	delay := firstBackoff
	down := time.Now() // not connected since
	var lastWarn time.Time
	attempts := 0
	for {
		err := s.session(ctx, client)
		wasUp := s.connected.Swap(false)
		s.agent.m.connected.WithLabelValues(s.addr).Set(0)
		if ctx.Err() != nil {
			return
		}
		if wasUp {
			log.Warn("aggregator stream ended; reconnecting", logging.KeyErr, err)
			down, lastWarn, attempts = time.Now(), time.Time{}, 0
		} else {
			attempts++
			if time.Since(down) >= connectGrace && time.Since(lastWarn) >= warnEvery {
				log.Warn("cannot reach the aggregator: no samples are delivered to it", logging.KeyDown, time.Since(down).Round(time.Second),
					logging.KeyAttempts, attempts, logging.KeyErr, err)
				lastWarn = time.Now()
			}
		}
		upFor := time.Duration(0)
		if wasUp {
			upFor = time.Since(s.upAt)
		}
		delay = backoffAfter(delay, upFor)
		// Full jitter: a fleet of agents does not reconnect in lockstep.
		if !sleep(ctx, time.Duration(mrand.Int64N(int64(delay))+1)) { //nolint:gosec // G404: reconnect jitter, not a secret
			return
		}
		delay = min(delay*2, s.agent.opts.ReconnectMaxBackoff)
	}
}

// firstBackoff is the reconnect delay's bound at first, and again after a
// stream up for healthyFor.
const firstBackoff, healthyFor = 100 * time.Millisecond, 10 * time.Second

// backoffAfter is the reconnect delay's bound after a stream up for
// upFor (0: never welcomed): the first again once it was up for a while,
// else delay. A session never up that took as long (a welcome not sent
// within its wait, a dial to an address that drops packets) reset it
// too, and a fleet whose streams failed together retried every 10 s with
// 100 ms of jitter, in lockstep, where the backoff would have spread them.
func backoffAfter(delay, upFor time.Duration) time.Duration {
	if upFor > healthyFor {
		return firstBackoff
	}
	return delay
}

// session runs one stream until it fails or ctx ends.
func (s *streamer) session(ctx context.Context, client pulsev1.IngestClient) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stream, err := s.open(ctx, cancel, client)
	if err != nil {
		return err
	}
	var acked, sent atomic.Uint64 // the last batch acknowledged, and handed to Send
	var sentAt atomic.Int64       // when the last Send of a batch returned (Unix ns; 0 while one is under way)
	var cataloguing atomic.Int64  // since when a catalogue is being sent (Unix ns; 0: none is)
	read := make(chan struct{})
	go func() { defer close(read); s.readAcks(stream, cancel, &acked) }()
	// The session ends with its reader: a late ack set the address's acked
	// gauge again after fanOut had deleted its series (the address gone).
	// Its Recv ends with ctx on either transport. And with its watch of the
	// acks, which outlived the agent's Run.
	watched := make(chan struct{})
	defer func() { cancel(nil); <-read; <-watched }()
	go func() { defer close(watched); watchAcks(ctx, cancel, &sent, &acked, &sentAt, &cataloguing) }()

	enc := wire.NewEncoder()
	cs := catalogueSent{sent: map[uint32]discovery.Target{}, first: true}
	var seq uint64
	// The heartbeat is due heartbeatEvery after the last batch sent: a
	// ticker checked at each tick found a batch sent a moment after the
	// tick before not yet heartbeatEvery old, and every other heartbeat
	// was skipped (one each 20 s, past the 10 s after which watchAcks
	// judges an idle stream: a dead connection stayed "connected").
	beat := time.NewTimer(heartbeatEvery)
	defer beat.Stop()
	due := false // a heartbeat is due: no batch for heartbeatEvery
	for {
		version, current, changed := s.agent.cat.snapshot()
		if cs.first || version != cs.version {
			cataloguing.Store(time.Now().UnixNano())
			err := cs.send(stream, enc, version, current)
			cataloguing.Store(0)
			if err != nil {
				return SendFailed(ctx, err)
			}
		}
		batch := s.batch(cs.ids, enc)
		if batch == nil && due {
			batch = &pulsev1.SampleBatch{TimeUnixMs: time.Now().UnixMilli()} // a heartbeat
		}
		due = false
		if batch != nil {
			beat.Reset(heartbeatEvery)
			seq++
			batch.Seq = seq
			msg := &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: batch}}
			sent.Store(seq)
			sentAt.Store(0)
			err := stream.Send(msg)
			sentAt.Store(time.Now().UnixNano())
			if err != nil {
				return SendFailed(ctx, fmt.Errorf("send batch: %w", err))
			}
			s.agent.m.batches.WithLabelValues(s.addr).Inc()
			s.agent.m.bytes.WithLabelValues(s.addr).Add(float64(proto.Size(msg)))
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-changed:
		case <-beat.C:
			due = true
		case <-s.wake:
			// Gather what the other scrapes of this tick bring.
			if !sleep(ctx, s.agent.opts.BatchDelay) {
				return context.Cause(ctx)
			}
		}
	}
}

// SendFailed is why a session ends at a failed Send: the session's cause
// when watchAcks, readAcks or the agent ended it. A stream the aggregator
// ended fails its Send with io.EOF on either transport and gives its
// status to Recv, which readAcks makes the cause: that is waited for, up
// to statusWait, so that the log says why (a token expired, a bound)
// rather than EOF. The fleet harness's agents end their sessions so too.
func SendFailed(ctx context.Context, err error) error {
	if errors.Is(err, io.EOF) && ctx.Err() == nil {
		t := time.NewTimer(statusWait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// statusWait bounds SendFailed's wait for the stream's status.
const statusWait = time.Second

// heartbeatEvery: a stream that has sent no batch this long (its node has
// no ready pod: an idle GPU node, or its pods loading their model) sends
// an empty one. The aggregator ends a stream whose token expired only at
// a message, and looks entries it could not look up again only at a
// batch: an idle agent's stream went on with neither, its entries never
// held and its token's expiry never seen. On the framed transport it is
// also what keeps the connection: the aggregator ends one that sends
// nothing for a minute.
var heartbeatEvery = HeartbeatEvery

// HeartbeatEvery is heartbeatEvery's value (the fleet harness's agents
// heartbeat as the agent does).
const HeartbeatEvery = 10 * time.Second

// watchAcks ends the session when batches sent wait past ackDeadline for
// an ack. An aggregator that takes batches and acknowledges none (a handler
// stuck; gRPC's transport still answers the keepalives) held the stream
// for ever; one that stops reading altogether fills the stream's flow
// control window, and Send then blocks until the stream's context ends:
// so the watch runs beside the sends, not after them.
//
// The aggregator acknowledges at a batch, at most every AckEvery: the last
// batches before the node has no ready pod left wait for the next, and a
// stream with none to send (its last Send returned a third of ackDeadline
// ago: AckEvery) waits for nothing; a Send blocked is no idle stream. It was ended 30 s after every node's last replica
// went, on every aggregator replica, its catalogue sent again at the
// reconnect.
//
// A catalogue is acknowledged by no ack: one sent while no batch waits
// (before the first, or after the last was acknowledged) and blocked past
// ackDeadline (the aggregator reads nothing, its window full) ends the
// session too. Before, nothing did, and the stream said it was connected
// for ever while no batch went out.
func watchAcks(ctx context.Context, cancel context.CancelCauseFunc, sent, acked *atomic.Uint64, sentAt, cataloguing *atomic.Int64) {
	var waiting time.Time // since when sent batches wait with no ack come (zero: none waits)
	var last uint64       // the ack last seen
	for sleep(ctx, ackDeadline/4) {
		a := acked.Load()
		// A catalogue's Send blocked past the deadline ends the stream,
		// whether batches wait for an ack or not: behind unacknowledged
		// batches (acks come every 10 s) it held the session's loop, so no
		// batch was sent after it, the batch watch reset as idle, and the
		// stream stayed connected for ever, delivering nothing.
		if c := cataloguing.Load(); c != 0 && time.Since(time.Unix(0, c)) > ackDeadline {
			cancel(fmt.Errorf("a catalogue not taken in %s: the aggregator reads no more", ackDeadline))
			return
		}
		switch {
		case a != last || sent.Load() <= a || idle(sentAt.Load()):
			last, waiting = a, time.Time{}
		case waiting.IsZero():
			waiting = time.Now()
		case time.Since(waiting) > ackDeadline:
			cancel(fmt.Errorf("no batch acknowledged in %s: the aggregator takes no more", ackDeadline))
			return
		}
	}
}

// idle is whether a stream whose last Send of a batch returned at
// sentAt (0: one is under way) has sent none since, for a third of
// ackDeadline.
func idle(sentAt int64) bool {
	return sentAt != 0 && time.Since(time.Unix(0, sentAt)) > ackDeadline/3
}

// open opens the stream and says hello; the aggregator must answer with a
// welcome. It fails fast: an unreachable aggregator is an error with its
// reason (the last connection error), counted and reported by run, not a
// wait.
func (s *streamer) open(ctx context.Context, cancel context.CancelCauseFunc, client pulsev1.IngestClient) (pulsev1.Ingest_ReportClient, error) {
	if s.agent.opts.Relay != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, relay.UpstreamKey, s.addr)
	}
	// A replica whose handler is stuck before its welcome held the stream
	// for ever, in silence (gRPC's transport answers the keepalives); so
	// did a stream that never opened: through a relay every replica's
	// stream shares the agent's one connection, which carries at most
	// relay.MaxStreamsPerConnection, and gRPC waits for room with no bound.
	why := fmt.Errorf("no welcome within %s", welcomeWait)
	if s.agent.opts.Relay != "" {
		why = fmt.Errorf("no welcome within %s (through the relay, whose connection carries at most %d streams, one an aggregator replica)", welcomeWait, relay.MaxStreamsPerConnection)
	}
	noWelcome := time.AfterFunc(welcomeWait, func() { cancel(why) })
	defer noWelcome.Stop()
	stream, err := client.Report(ctx)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = cause
		}
		return nil, fmt.Errorf("open stream: %w", err)
	}
	names := make([]string, 0, len(s.agent.extractor.Extras()))
	for _, x := range s.agent.extractor.Extras() {
		names = append(names, x.Name)
	}
	if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{
		Node: s.agent.opts.NodeName, AgentVersion: version.Version, AgentInstance: instance,
		ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1, ExtraMetrics: names,
		AckEveryMs: uint32(AckEvery.Milliseconds())}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("send hello: %w", err)
	}
	// io.EOF: the aggregator ended the stream, and its status is Recv's.
	welcome, err := stream.Recv()
	noWelcome.Stop()
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = cause
		}
		return nil, fmt.Errorf("receive welcome: %w", err)
	}
	if welcome.GetWelcome() == nil {
		return nil, errors.New("aggregator did not answer the hello with a welcome")
	}
	s.upAt = time.Now()
	s.connected.Store(true)
	s.agent.m.connected.WithLabelValues(s.addr).Set(1)
	s.agent.log.Info("aggregator stream open", logging.KeyAggregator, s.addr, logging.KeyVersion, welcome.GetWelcome().AggregatorVersion)
	return stream, nil
}

// readAcks reads the aggregator's acks until the stream ends, and then ends
// the session with the reason.
func (s *streamer) readAcks(stream pulsev1.Ingest_ReportClient, cancel context.CancelCauseFunc, acked *atomic.Uint64) {
	for {
		msg, err := stream.Recv()
		if err != nil {
			cancel(fmt.Errorf("receive: %w", err))
			return
		}
		if ack := msg.GetAck(); ack != nil {
			acked.Store(ack.Seq)
			s.agent.m.acked.WithLabelValues(s.addr).Set(float64(ack.Seq))
		}
	}
}

// A stream is dead when the aggregator does not welcome it within
// welcomeWait, or acknowledges none of the batches sent for ackDeadline
// (it acks at least every AckEvery while batches come).
var (
	welcomeWait = 10 * time.Second
	ackDeadline = 3 * AckEvery
)

// catalogueSent is the catalogue a session has sent: the targets by id,
// their ids by pod UID (for encoding batches) and the version.
type catalogueSent struct {
	sent    map[uint32]discovery.Target
	ids     map[string]uint32
	version uint64
	first   bool
}

// send sends what changed from the catalogue sent to current (all of it
// the first time); the encoder forgets the pods removed or replaced.
func (cs *catalogueSent) send(stream pulsev1.Ingest_ReportClient, enc *wire.Encoder, version uint64, current map[uint32]discovery.Target) error {
	c := DiffCatalogue(cs.sent, current, cs.first)
	for _, id := range c.Remove {
		enc.Forget(id)
	}
	for _, p := range c.Upsert {
		if old, ok := cs.sent[p.Id]; ok && old.UID != p.Uid {
			enc.Forget(p.Id)
		}
	}
	if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: c}}); err != nil {
		return fmt.Errorf("send catalogue: %w", err)
	}
	cs.sent, cs.version, cs.first = current, version, false
	cs.ids = make(map[string]uint32, len(current))
	for id, t := range current {
		cs.ids[t.UID] = id
	}
	return nil
}

// batch encodes the pending results of pods in the sent catalogue (ids:
// uid → id).
func (s *streamer) batch(ids map[string]uint32, enc *wire.Encoder) *pulsev1.SampleBatch {
	pending := s.take()
	if len(pending) == 0 {
		return nil
	}
	results := make([]result, 0, len(pending))
	for _, r := range pending {
		if _, ok := ids[r.uid]; ok {
			results = append(results, r)
		}
	}
	if len(results) == 0 {
		return nil
	}
	sort.Slice(results, func(i, j int) bool { return results[i].timeMs < results[j].timeMs })
	// A result held past maxHeldMs before the newest (a long outage, a
	// clock stepped) is past any window, and its offset from the batch's
	// time could overflow the wire's int32 milliseconds (24.8 days): it
	// goes.
	newest := results[len(results)-1].timeMs
	first := sort.Search(len(results), func(i int) bool { return newest-results[i].timeMs <= maxHeldMs })
	results = results[first:]
	b := &pulsev1.SampleBatch{TimeUnixMs: results[0].timeMs}
	for _, r := range results {
		s := wire.Sample{Pod: ids[r.uid], OffsetMs: int32(r.timeMs - b.TimeUnixMs), Missing: r.missing, Error: r.err,
			Values: r.page.Values, Hist: r.page.Hist}
		for _, x := range r.page.Extra {
			if !math.IsNaN(x) {
				s.Extra = r.page.Extra
				break
			}
		}
		enc.Append(b, &s)
	}
	return b
}

// dial makes the agent's connection to target (an aggregator, or the
// relay), whose certificate must name serverName.
func (a *Agent) dial(target, serverName string) (*grpc.ClientConn, error) {
	return grpc.NewClient(target, append(a.transport(serverName),
		grpc.WithKeepaliveParams(ClientKeepalive),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: a.opts.ReconnectMaxBackoff},
			MinConnectTimeout: 2 * time.Second}))...)
}

// dialRelay is the agent's one connection to --relay, which carries every
// replica's stream (each naming its replica, relay.UpstreamKey); its
// certificate must name the relay's host. nil without --relay.
func (a *Agent) dialRelay() (*grpc.ClientConn, error) {
	if a.opts.Relay == "" {
		return nil, nil
	}
	host, _, _ := net.SplitHostPort(a.opts.Relay)
	return a.dial(a.opts.Relay, host)
}

// transport is how the agent reaches an aggregator: plaintext, or TLS
// trusting --aggregator-ca-file (checking serverName), with the
// ServiceAccount token of --token-file on every stream. The CA file is read
// at each handshake (parsed again only when it changes): a CA published
// after the agent starts (the aggregator's managed CA, mounted from a
// ConfigMap) or renewed later is trusted without a restart.
func (a *Agent) transport(serverName string) []grpc.DialOption {
	if a.opts.AggregatorCAFile == "" {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	ca := &certs.CAFile{Path: a.opts.AggregatorCAFile, Flag: "--aggregator-ca-file", Name: serverName}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientConfig(serverName)))}
	if a.opts.TokenFile != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenFile(a.opts.TokenFile)))
	}
	return opts
}

// framedClient is the agent's framed transport to the aggregator at addr
// (--transport=framed, and auto's): the same TLS, CA and token as
// transport's, on a connection of each stream's own; a stream to an
// aggregator that does not speak it goes on fallback when there is one
// (auto's gRPC client), onFallback told why.
func (a *Agent) framedClient(addr, serverName string, fallback pulsev1.IngestClient, onFallback func(error)) (*framed.Client, error) {
	o := framed.ClientOptions{Fallback: fallback}
	if fallback != nil {
		o.OnFallback = onFallback
	}
	if a.opts.AggregatorCAFile != "" {
		ca := &certs.CAFile{Path: a.opts.AggregatorCAFile, Flag: "--aggregator-ca-file", Name: serverName}
		o.TLS = ca.ClientConfig(serverName)
		if f := tokenFile(a.opts.TokenFile); f != "" {
			o.Token = f.read
		}
	}
	return framed.NewClient(addr, o)
}

// tokenFile sends the token in a file, re-read on every stream, so that a
// rotated projected token is picked up.
type tokenFile string

func (f tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	t, err := f.read()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + t}, nil
}

func (f tokenFile) read() (string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return "", fmt.Errorf("read --token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (tokenFile) RequireTransportSecurity() bool { return true }

// unixMs is t in Unix milliseconds, 0 for the zero time (unknown).
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// DiffCatalogue is the catalogue message that turns sent into current (all
// of current when full). The fleet harness (test/fleet) sends its simulated
// agents' catalogues with it, so that they speak as the agent does.
func DiffCatalogue(sent, current map[uint32]discovery.Target, full bool) *pulsev1.Catalogue {
	c := &pulsev1.Catalogue{Full: full}
	for id, old := range sent {
		if t, ok := current[id]; !ok || t.UID != old.UID {
			c.Remove = append(c.Remove, id)
		}
	}
	for id, t := range current {
		if old, ok := sent[id]; full || !ok || !old.Equal(t) {
			p := &pulsev1.Pod{Id: id, Uid: t.UID, Namespace: t.Namespace, Name: t.Pod, Ready: t.Ready, Terminating: t.Terminating,
				Demand: t.Demand != nil, CreatedUnixMs: unixMs(t.Created), ReadySinceUnixMs: unixMs(t.ReadySince), UnreadySinceUnixMs: unixMs(t.UnreadySince)}
			for _, w := range t.Workloads {
				p.Workloads = append(p.Workloads, &pulsev1.Workload{Kind: w.Kind, Name: w.Name})
			}
			c.Upsert = append(c.Upsert, p)
		}
	}
	if full {
		c.Remove = nil
	}
	sort.Slice(c.Upsert, func(i, j int) bool { return c.Upsert[i].Id < c.Upsert[j].Id })
	sort.Slice(c.Remove, func(i, j int) bool { return c.Remove[i] < c.Remove[j] })
	return c
}
