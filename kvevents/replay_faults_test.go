package kvevents_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// rogueMode is how a fake replay server answers a request for seq 0..
type rogueMode int

const (
	rogueSilent  rogueMode = iota // reads requests, never answers
	rogueGarbage                  // answers with malformed replies, without end
	roguePartial                  // answers seqs 0-2, then stops (no end marker)
	rogueRepeat                   // answers seq 0 again and again
	rogueEndless                  // answers 0, 1, 2, … without end
)

// replayServer binds a ROUTER on loopback and runs serve on a goroutine
// that owns the socket until the test ends (serve returns once quit is
// closed); it returns the endpoint to connect to. serve's request waits up
// to 10 ms for a replay request and returns its sender's identity.
func replayServer(t *testing.T, serve func(sock *zmq.Socket, request func() (peer []byte, ok bool), quit <-chan struct{})) string {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	_ = sock.SetSndhwm(0) // a scripted exchange may exceed the default 1,000 (ROUTER drops past it)
	if err := sock.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := sock.GetLastEndpoint()
	quit, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(quit); <-done; _ = sock.Close(); _ = zctx.Term() })
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	request := func() ([]byte, bool) {
		polled, err := poller.Poll(10 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			return nil, false
		}
		req, err := sock.RecvMessageBytes(0)
		if err != nil || len(req) != 3 {
			return nil, false
		}
		return req[0], true
	}
	go func() {
		defer close(done)
		serve(sock, request, quit)
	}()
	return zmqep.Connectable(ep)
}

// rogueReplay runs a ROUTER that answers every replay request in mode, with
// payload as every batch, until the test ends. Its goroutine owns the socket.
func rogueReplay(t *testing.T, mode rogueMode, payload []byte) string {
	t.Helper()
	return replayServer(t, func(sock *zmq.Socket, request func() ([]byte, bool), quit <-chan struct{}) {
		var peer []byte
		var next uint64
		// Paced by a ticker, so the flood stays small; the subscriber must
		// end the exchange however fast or slow the server chatters.
		pace := time.NewTicker(time.Millisecond)
		defer pace.Stop()
		for {
			select {
			case <-quit:
				return
			default:
			}
			if peer == nil || mode == rogueSilent || mode == roguePartial && next > 2 {
				if p, ok := request(); ok {
					peer, next = p, 0
				}
				continue
			}
			var err error
			switch mode {
			case rogueGarbage:
				_, err = sock.SendMessage(peer, "not-empty", seq8(next), payload)
			case rogueRepeat:
				_, err = sock.SendMessage(peer, "", seq8(0), payload)
			default:
				_, err = sock.SendMessage(peer, "", seq8(next), payload)
				next++
			}
			if err != nil {
				peer = nil
			}
			select {
			case <-quit:
				return
			case <-pace.C:
			}
		}
	})
}

// TestReplayServerFaults: a gap is followed by a replay exchange with a
// faulty server. Whatever it does, the exchange ends (the socket loop is
// not held: the live batch after the gap is delivered), the fault is
// counted, what was not replayed is lost history, nothing is delivered
// twice or out of order (view.handle checks), and Close leaves no goroutine.
func TestReplayServerFaults(t *testing.T) {
	beforeAll := runtime.NumGoroutine()
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	cases := []struct {
		name     string
		mode     rogueMode
		down     bool
		lostFrom uint64 // 0: no lost history expected
		replayed uint64
	}{
		{name: "down", down: true, lostFrom: 1},
		{name: "silent", mode: rogueSilent, lostFrom: 1},
		{name: "garbage", mode: rogueGarbage, lostFrom: 1},
		{name: "partial", mode: roguePartial, lostFrom: 3, replayed: 2},
		{name: "repeats-forever", mode: rogueRepeat, lostFrom: 1},
		{name: "streams-forever", mode: rogueEndless, replayed: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			replay := "tcp://127.0.0.1:1" // nothing listens on port 1
			if !tc.down {
				replay = rogueReplay(t, tc.mode, good)
			}
			pub, sub := joinedRawPubCfg(t, good, kvevents.SubscriberConfig{
				ReplayEndpoint: replay, ReplayTimeout: 300 * time.Millisecond, MaxReplayBatches: 50,
			})
			v := newView()
			v.last[0] = 0 // seq 0 was delivered by the join
			if _, err := pub.SendMessage("", seq8(5), good); err != nil {
				t.Fatal(err)
			}
			pump(t, sub, v, "the live batch after the gap", func() bool { return v.last[0] == 5 })
			st := sub.Stats()
			if st.ReplayFailures == 0 || st.Replays != 1 || st.Replayed != tc.replayed {
				t.Fatalf("stats %+v: want one replay, counted as failed, %d batches replayed", st, tc.replayed)
			}
			switch {
			case tc.lostFrom == 0 && len(v.lost) != 0:
				t.Fatalf("lost history %+v, want none", v.lost)
			case tc.lostFrom != 0 && (len(v.lost) != 1 || v.lost[0].From != tc.lostFrom || v.lost[0].Seq != 5):
				t.Fatalf("lost history %+v, want [%d, 5)", v.lost, tc.lostFrom)
			}
			if tc.mode == rogueGarbage && !tc.down && st.Malformed == 0 {
				t.Fatalf("garbage replies not counted: %+v", st)
			}
		})
	}
	// The subtests' servers and subscribers are closed by now (Cleanup).
	testutil.WaitFor(t, 5*time.Second, "goroutines to stop", func() bool { return runtime.NumGoroutine() <= beforeAll })
}

// TestLiveEndMarkerSeq: a live message numbered ff×8 (the replay end
// marker's seq, never a batch's) is malformed. Taken as a batch it wrapped
// the next expected seq to 0, so the next real batch replayed everything
// from 0 and delivered it a second time.
func TestLiveEndMarkerSeq(t *testing.T) {
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 21)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
	v := newView()
	connect(t, sub, v, eng)
	for i := 0; i < 5; i++ {
		eng.step()
	}
	pump(t, sub, v, "caught up", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })
	base := sub.Stats()

	if err := eng.pub.SendRaw("", seq8(math.MaxUint64), good); err != nil {
		t.Fatal(err)
	}
	eng.step()
	pump(t, sub, v, "the next batch", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })
	st := sub.Stats()
	if st.Malformed-base.Malformed != 1 || st.Delivered-base.Delivered != 1 || st.Replayed != base.Replayed || len(v.lost)+len(v.resets) != 0 {
		t.Fatalf("stats %+v (before %+v), lost %+v, resets %+v: want one malformed message and one batch", st, base, v.lost, v.resets)
	}
	if !equalTo(v, eng)() {
		t.Fatal("view differs from the engine")
	}
}

// TestBigBatchesDoNotStayInMemory: the decode slots reuse their slices, so
// each used to keep the capacity of the biggest batch it ever held: after a
// burst of big batches (a long prefill) QueueSize+2 of them stayed in memory
// for good. A slot that held a batch far bigger than the next one now lets
// it go.
func TestBigBatchesDoNotStayInMemory(t *testing.T) {
	small := readFixture(t, "vllm_batch_array_form.msgpack")
	big := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, Medium: "GPU"}
	for i := uint64(0); i < 1<<16; i++ { // 1M tokens: ~5 MiB decoded
		big.BlockHashes = append(big.BlockHashes, 1<<40+i)
		for j := uint32(0); j < 16; j++ {
			big.TokenIDs = append(big.TokenIDs, 1000+j)
		}
	}
	bigPayload := kvtest.AppendBatch(nil, &kvevents.Batch{Events: []kvevents.Event{big}}, kvtest.ArrayForm)
	big = kvevents.Event{}
	const slots = 8 + 2 // QueueSize + 2
	pub, sub := joinedRawPubCfg(t, small, kvevents.SubscriberConfig{QueueSize: 8})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seq := uint64(0)
	send := func(payload []byte, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			seq++
			if _, err := pub.SendMessage("", seq8(seq), payload); err != nil {
				t.Fatal(err)
			}
			m, err := sub.Next(ctx)
			if err != nil || m.Kind != kvevents.MsgBatch || m.Seq != seq {
				t.Fatalf("message %+v, %v; want batch %d", m, err, seq)
			}
		}
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	send(small, 2*slots)
	before := heap()
	send(bigPayload, slots) // every slot holds a big batch once
	send(small, 2*slots)    // then only small ones
	if after := heap(); after > before+(16<<20) {
		t.Fatalf("heap %d MiB after the big batches passed, %d MiB before", after>>20, before>>20)
	}
}

// TestIdleProbeBacksOffWhileReplayIsDown: each failed probe holds the socket
// loop for ReplayTimeout; while the replay socket stays down, probes back
// off (doubling) instead of repeating every IdleProbe. Slowness can only
// make the measured time longer, so the lower bound cannot flake.
func TestIdleProbeBacksOffWhileReplayIsDown(t *testing.T) {
	const probe, failures = 5 * time.Millisecond, 9
	start := time.Now()
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:1",
		IdleProbe: probe, ReplayTimeout: 10 * time.Millisecond, PollInterval: time.Millisecond})
	testutil.WaitFor(t, 60*time.Second, "failed probes", func() bool { return sub.Stats().ReplayFailures >= failures })
	// Backed off: the probes after the first waited 2, 4, … 256 × IdleProbe
	// (2.55 s in all); without it, 9 probes take 9 × (IdleProbe + timeout).
	if elapsed := time.Since(start); elapsed < 200*probe {
		t.Fatalf("%d failed probes in %v: no backoff (stats %+v)", failures, elapsed, sub.Stats())
	}
}

// scriptedReplay runs a ROUTER that answers its k-th replay request with
// script[k] (each reply's frames after the peer's identity) and any later
// request with the end marker alone. Its goroutine owns the socket.
func scriptedReplay(t *testing.T, script [][][][]byte) string {
	t.Helper()
	return replayServer(t, func(sock *zmq.Socket, request func() ([]byte, bool), quit <-chan struct{}) {
		end := [][]byte{{}, seq8(math.MaxUint64), {}}
		for k := 0; ; {
			select {
			case <-quit:
				return
			default:
			}
			peer, ok := request()
			if !ok {
				continue
			}
			replies := [][][]byte{end}
			if k < len(script) {
				replies = script[k]
			}
			k++
			for _, r := range replies {
				if _, err := sock.SendMessage(peer, r); err != nil {
					break
				}
			}
		}
	})
}

// TestReplayEndedEarlyLeavesNoStaleReplies: a batch with an empty payload
// looks like the end marker (the robust end test is an empty last frame),
// so the exchange ends there and the engine's later replies (seqs 7, 8 and
// the real end) are still on their way. They used to wait in the replay
// socket's queue and be read as the next exchange's replies: after an
// engine restart, the old engine's batches were delivered as the new one's
// history. The next exchange must see only its own replies.
func TestReplayEndedEarlyLeavesNoStaleReplies(t *testing.T) {
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	end := [][]byte{{}, seq8(math.MaxUint64), {}}
	replay := scriptedReplay(t, [][][][]byte{
		{{{}, seq8(0), good}, {{}, seq8(1), {}}, {{}, seq8(7), good}, {{}, seq8(8), good}, end},
		{end}, // the second exchange: nothing buffered
	})
	pub, sub := joinedRawPubCfg(t, good, kvevents.SubscriberConfig{ReplayEndpoint: replay})
	v := newView()
	v.last[0] = 0                          // seq 0 was delivered by the join
	for _, live := range []uint64{5, 10} { // a gap before each: one exchange each
		if _, err := pub.SendMessage("", seq8(live), good); err != nil {
			t.Fatal(err)
		}
		pump(t, sub, v, fmt.Sprintf("live batch %d", live), func() bool { return v.last[0] == live })
	}
	st := sub.Stats()
	if st.Replays != 2 || st.Replayed != 0 {
		t.Fatalf("stats %+v: want two exchanges and no batch replayed", st)
	}
	if len(v.lost) != 2 || v.lost[0].From != 1 || v.lost[0].Seq != 5 || v.lost[1].From != 6 || v.lost[1].Seq != 10 {
		t.Fatalf("lost history %+v, want [1, 5) and [6, 10)", v.lost)
	}
}
