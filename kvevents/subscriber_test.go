package kvevents_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestDropsAreReplayed: a fraction of batches never goes out live; the
// subscriber notices every gap, replays it, and ends with the engine's view.
func TestDropsAreReplayed(t *testing.T) {
	for _, layout := range []kvtest.ReplayLayout{kvtest.ReplayWithTopic, kvtest.ReplayLegacy} {
		for _, form := range []kvtest.EventForm{kvtest.ArrayForm, kvtest.MapForm} {
			name := map[kvtest.ReplayLayout]string{kvtest.ReplayWithTopic: "topic-layout", kvtest.ReplayLegacy: "legacy-layout"}[layout] + "/" + form.String()
			t.Run(name, func(t *testing.T) {
				eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv-events", Layout: layout, Form: form}, 1)
				sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
				v := newView()
				connect(t, sub, v, eng)

				eng.pub.SetDropRate(0.3)
				for i := 0; i < 150; i++ {
					eng.step()
				}
				eng.pub.SetDropRate(0)
				eng.step() // a live batch after the last drop reveals the gap
				pump(t, sub, v, "views to converge after drops", equalTo(v, eng))
				pump(t, sub, v, "every batch", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })

				st := sub.Stats()
				if eng.pub.Stats().Dropped == 0 || st.Gaps == 0 || st.Replays == 0 || st.Replayed < eng.pub.Stats().Dropped {
					t.Fatalf("publisher %+v, subscriber %+v: drops were not all replayed", eng.pub.Stats(), st)
				}
				if st.LostHistory != 0 || st.Resets != 0 || len(v.lost) != 0 {
					t.Fatalf("unexpected lost history or reset: %+v", st)
				}
			})
		}
	}
}

// TestRestartResets: the engine's sequence goes back to 0; the consumer is
// told to drop the rank's state before the new incarnation's batches.
func TestRestartResets(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 2)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
	v := newView()
	connect(t, sub, v, eng)
	for i := 0; i < 30; i++ {
		eng.step()
	}
	pump(t, sub, v, "first incarnation", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })

	eng.restart()
	for i := 0; i < 5; i++ {
		eng.step()
	}
	pump(t, sub, v, "reset and new incarnation", func() bool { return len(v.resets) == 1 && v.last[0] == eng.pub.NextSeq()-1 })
	if !equalTo(v, eng)() {
		t.Fatal("view differs from the restarted engine")
	}
	if v.resets[0].Seq != 0 || sub.Stats().Resets != 1 {
		t.Fatalf("reset %+v, stats %+v", v.resets[0], sub.Stats())
	}

	// A restart whose first batches are lost: the reset comes first, then
	// replay fills the new incarnation from seq 0.
	eng.restart()
	eng.pub.DropNext(3)
	for i := 0; i < 4; i++ {
		eng.step()
	}
	pump(t, sub, v, "second restart", func() bool { return len(v.resets) == 2 && v.last[0] == 3 })
	if !equalTo(v, eng)() || v.resets[1].Seq != 3 || len(v.lost) != 0 {
		t.Fatalf("after a restart with lost first batches: resets %+v lost %+v", v.resets, v.lost)
	}
}

// TestRestartPastOldSequence: the engine restarts and its new sequence
// passes the old one before any live batch arrives, so the live stream shows
// only a gap; the replay's overlap batch differs from what was delivered,
// which reveals the restart.
func TestRestartPastOldSequence(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 12)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
	v := newView()
	connect(t, sub, v, eng)
	for i := 0; i < 10; i++ {
		eng.step()
	}
	pump(t, sub, v, "first incarnation", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })
	oldLast := v.last[0]

	eng.restart()
	eng.pub.DropNext(int(oldLast) + 5)
	for i := uint64(0); i < oldLast+6; i++ {
		eng.step()
	}
	pump(t, sub, v, "reset and the new incarnation", func() bool { return len(v.resets) == 1 && v.last[0] == eng.pub.NextSeq()-1 })
	if !equalTo(v, eng)() || len(v.lost) != 0 {
		t.Fatalf("view differs from the restarted engine (lost %+v)", v.lost)
	}
	// A plain gap in the same incarnation must not look like a restart.
	eng.pub.DropNext(3)
	for i := 0; i < 4; i++ {
		eng.step()
	}
	pump(t, sub, v, "gap filled", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })
	if len(v.resets) != 1 || !equalTo(v, eng)() {
		t.Fatalf("resets %+v after a plain gap", v.resets)
	}
}

// TestLostHistory: the replay buffer no longer reaches back; the consumer
// is told which batches are gone and then sees the engine from there on.
func TestLostHistory(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 4}, 3)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
	v := newView()
	connect(t, sub, v, eng)
	pump(t, sub, v, "caught up", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })

	gapStart := eng.pub.NextSeq()
	eng.pub.DropNext(10)
	for i := 0; i < 11; i++ { // 10 dropped, the buffer keeps only the last 4
		eng.step()
	}
	end := eng.pub.NextSeq()
	pump(t, sub, v, "lost history and catch-up", func() bool { return len(v.lost) == 1 && v.last[0] == end-1 })
	lost := v.lost[0]
	if lost.From != gapStart || lost.Seq != end-4 {
		t.Fatalf("lost %+v, want From %d Seq %d", lost, gapStart, end-4)
	}
	// The consumer's view is exactly the engine's batches from lost.Seq on.
	want := engineModel{}
	for _, b := range eng.log[lost.Seq:] {
		want.apply(0, &b)
	}
	if !maps.Equal(v.model.rank(0), want.rank(0)) {
		t.Fatal("view after lost history differs from the batches that followed it")
	}
	if st := sub.Stats(); st.LostHistory != 1 || st.Replayed < 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestNoReplayEndpoint: without replay every gap is lost history.
func TestNoReplayEndpoint(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{}, 4)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint()})
	v := newView()
	connect(t, sub, v, eng)
	pump(t, sub, v, "caught up", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })
	lostBefore := len(v.lost)
	eng.pub.DropNext(2)
	for i := 0; i < 3; i++ {
		eng.step()
	}
	end := eng.pub.NextSeq()
	pump(t, sub, v, "lost history", func() bool { return len(v.lost) == lostBefore+1 && v.last[0] == end-1 })
	if l := v.lost[lostBefore]; l.From != end-3 || l.Seq != end-1 {
		t.Fatalf("lost %+v, want From %d Seq %d", l, end-3, end-1)
	}
}

// TestDPRanks: one subscriber follows three ranks, each with its own faults.
func TestDPRanks(t *testing.T) {
	var engines []*fakeEngine
	var eps, reps []string
	for r := 0; r < 3; r++ {
		e := newFakeEngine(t, kvtest.PublisherConfig{DPRank: r, ReplayEndpoint: "tcp://127.0.0.1:*", Layout: kvtest.ReplayLayout(r % 2)}, uint64(10+r))
		engines = append(engines, e)
		eps = append(eps, e.pub.Endpoint())
		reps = append(reps, e.pub.ReplayEndpoint())
	}
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoints: eps, ReplayEndpoints: reps})
	v := newView()
	connect(t, sub, v, engines...)
	engines[1].pub.SetDropRate(0.5)
	for i := 0; i < 60; i++ {
		for _, e := range engines {
			e.step()
		}
		if i == 30 {
			engines[2].restart()
		}
	}
	engines[1].pub.SetDropRate(0)
	for _, e := range engines {
		e.step()
	}
	pump(t, sub, v, "all ranks converge", func() bool {
		for _, e := range engines {
			if v.last[e.rank] != e.pub.NextSeq()-1 {
				return false
			}
		}
		return equalTo(v, engines...)()
	})
	if len(v.resets) != 1 || v.resets[0].Rank != 2 {
		t.Fatalf("resets %+v, want one on rank 2", v.resets)
	}
	if st := sub.Stats(); st.Replayed == 0 || st.LostHistory != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Every batch says which rank published it.
	for _, e := range engines {
		if e.log[len(e.log)-1].HasDPRank {
			t.Fatal("test batches must leave the rank to the publisher")
		}
	}
}

// TestBindMode: the engine's PUB connects and the subscriber binds.
func TestBindMode(t *testing.T) {
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: "tcp://127.0.0.1:*", Bind: true})
	ep := sub.Endpoints()[0]
	if ep == "tcp://127.0.0.1:*" || zmqep.ShouldBind(ep) {
		t.Fatalf("bound endpoint %q is not a real address", ep)
	}
	eng := newFakeEngine(t, kvtest.PublisherConfig{Endpoint: ep}, 5)
	if eng.pub.Endpoint() != ep {
		t.Fatalf("publisher endpoint %q, want to connect to %q", eng.pub.Endpoint(), ep)
	}
	v := newView()
	connect(t, sub, v, eng)
	var got kvevents.Message
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eng.step()
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v.handle(t, m)
		if m.Kind == kvevents.MsgBatch && m.Seq == eng.pub.NextSeq()-1 {
			got = m
			break
		}
	}
	if !got.Batch.HasDPRank || got.Batch.DPRank != 0 || !equalTo(v, eng)() {
		t.Fatalf("batch %+v", got.Batch)
	}
}

// TestMalformedMessages: wrong frame layouts are skipped; an undecodable
// payload is counted and reported as a one-batch hole.
func TestMalformedMessages(t *testing.T) {
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	pub, sub := joinedRawPub(t, good)
	seq := func(n byte) []byte { return seq8(uint64(n)) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base := sub.Stats()
	_, _ = pub.SendMessage("", "short-seq", good)      // malformed: seq not 8 bytes
	_, _ = pub.SendMessage("", seq(1))                 // malformed: two frames
	_, _ = pub.SendMessage("", seq(100), []byte{0xc1}) // decode error
	_, _ = pub.SendMessage("", seq(101), good)
	// A newer engine's event type is skipped inside an otherwise good batch.
	_, _ = pub.SendMessage("", seq(102), mp(byte(0x93), 1.0, byte(0x92), mp(byte(0x92), "PrefixCacheHit", 1), mp(byte(0x91), "AllBlocksCleared"), 0))
	var msgs []kvevents.Message
	for len(msgs) < 4 {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	st := sub.Stats()
	if st.Malformed-base.Malformed != 2 || st.DecodeErrors-base.DecodeErrors != 1 || st.UnknownEvents-base.UnknownEvents != 1 {
		t.Fatalf("stats %+v (before %+v)", st, base)
	}
	// Gap 1..99 (no replay) → lost; 100 undecodable → lost; 101 delivered.
	if msgs[0].Kind != kvevents.MsgLostHistory || msgs[0].Undecodable || msgs[1].Kind != kvevents.MsgLostHistory || !msgs[1].Undecodable || msgs[1].From != 100 || msgs[1].Seq != 101 ||
		msgs[2].Kind != kvevents.MsgBatch || msgs[2].Seq != 101 || msgs[3].Kind != kvevents.MsgBatch || len(msgs[3].Batch.Events) != 1 || msgs[3].Batch.Skipped != 1 {
		t.Fatalf("messages %+v", msgs)
	}
}

func TestSubscriberClose(t *testing.T) {
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:2"})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := sub.Next(context.Background()); !errors.Is(err, kvevents.ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	_ = pub.Close()
	if _, err := pub.Publish(&kvevents.Batch{}); !errors.Is(err, kvevents.ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := kvevents.SubscriberConfig{DPSize: -1, QueueSize: -1, Endpoint: "tcp://nohost"}
	err := bad.Validate()
	if !errors.Is(err, kvevents.ErrConfig) {
		t.Fatalf("err %v", err)
	}
	for _, want := range []string{"DPSize", "QueueSize", "Endpoint"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if err := (&kvevents.SubscriberConfig{Endpoints: []string{"tcp://a:1"}, ReplayEndpoint: "tcp://a:2"}).Validate(); !errors.Is(err, kvevents.ErrConfig) {
		t.Fatalf("Endpoints with a single ReplayEndpoint: %v", err)
	}
	if err := (&kvevents.SubscriberConfig{Endpoint: "tcp://a:1", LiveStart: true, ReplayOnStart: true}).Validate(); !errors.Is(err, kvevents.ErrConfig) {
		t.Fatalf("LiveStart with ReplayOnStart: %v", err)
	}
	pc := kvtest.PublisherConfig{Endpoint: "tcp://*:5557", DropRate: 2, DPRank: -1}
	if err := pc.Validate(); !errors.Is(err, kvevents.ErrConfig) || !strings.Contains(err.Error(), "DropRate") || !strings.Contains(err.Error(), "DPRank") {
		t.Fatalf("publisher validate: %v", err)
	}
}

func TestEndpoints(t *testing.T) {
	tests := []struct {
		in   string
		r    int
		want string
		bind bool
	}{
		{"tcp://*:5557", 2, "tcp://*:5559", true},
		{"tcp://10.0.0.1:5557", 1, "tcp://10.0.0.1:5558", false},
		{"tcp://127.0.0.1:*", 3, "tcp://127.0.0.1:*", true},
		{"tcp://127.0.0.1:0", 3, "tcp://127.0.0.1:0", true},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", true},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv-1", true},
	}
	for _, tt := range tests {
		got, err := kvevents.OffsetEndpoint(tt.in, tt.r)
		if err != nil || got != tt.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", tt.in, tt.r, got, err, tt.want)
		}
		if zmqep.ShouldBind(tt.in) != tt.bind {
			t.Errorf("zmqep.ShouldBind(%q) = %v", tt.in, !tt.bind)
		}
	}
	if zmqep.Connectable("tcp://0.0.0.0:1234") != "tcp://127.0.0.1:1234" || zmqep.Connectable("tcp://[::]:9") != "tcp://[::1]:9" {
		t.Error("connectable")
	}
}

func TestSubscriberCollector(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{}, 9)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint()})
	v := newView()
	connect(t, sub, v, eng)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(kvevents.NewSubscriberCollector("e1", sub)); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		got[f.GetName()] = f.GetMetric()[0].GetCounter().GetValue()
		if f.GetMetric()[0].GetLabel()[0].GetValue() != "e1" {
			t.Fatalf("%s: engine label %v", f.GetName(), f.GetMetric()[0].GetLabel())
		}
	}
	if len(got) != 13 || got["kvmesh_kvevents_received_total"] != float64(sub.Stats().Received) || got["kvmesh_kvevents_received_total"] == 0 {
		t.Fatalf("metrics %v, stats %+v", got, sub.Stats())
	}
}

// TestSlowConsumer: with a tiny queue and tiny high-water marks, a consumer
// that stops reading makes ZMQ drop messages; the subscriber turns that
// into gaps and replays, so the consumer still ends with the engine's view.
func TestSlowConsumer(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", HWM: 4}, 11)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint(), QueueSize: 1, RcvHWM: 4})
	v := newView()
	connect(t, sub, v, eng)
	for i := 0; i < 400; i++ { // nobody reads meanwhile
		eng.step()
	}
	// Batches dropped at the very end are only noticed when a later one
	// arrives (as with vLLM), so the engine keeps stepping while idle.
	stepUntil(t, sub, v, func() bool { return v.last[0] == eng.pub.NextSeq()-1 && equalTo(v, eng)() }, eng)
	if st := sub.Stats(); st.LostHistory != 0 || st.Delivered != eng.pub.NextSeq() || st.Replayed == 0 {
		t.Fatalf("stats %+v, published %d", st, eng.pub.NextSeq())
	}
}

// TestNoGoroutineLeak: a publisher/subscriber pair leaves nothing running.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), PollInterval: 5 * time.Millisecond, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			if _, err := pub.Publish(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}}); err != nil {
				t.Fatal(err)
			}
			c, cc := context.WithTimeout(ctx, 10*time.Millisecond)
			_, err := sub.Next(c)
			cc()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatal("never connected")
			}
		}
	}()
	testutil.WaitFor(t, 5*time.Second, "goroutines to stop", func() bool { return runtime.NumGoroutine() <= before })
}

// BenchmarkPubSub measures batches/s from Publish to Next over loopback TCP
// with the realistic 12-event batch of BenchmarkDecodeBatch.
func BenchmarkPubSub(b *testing.B) {
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	batch := benchBatch()
	ctx := context.Background()
	// Join: publish until the first message arrives.
	for {
		if _, err := pub.Publish(batch); err != nil {
			b.Fatal(err)
		}
		c, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		_, err := sub.Next(c)
		cancel()
		if err == nil {
			break
		}
	}
	kvevents.DrainOut(sub)
	target := pub.NextSeq() + uint64(b.N) - 1
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for i := 0; i < b.N; i++ {
			if _, err := pub.Publish(batch); err != nil {
				return
			}
		}
	}()
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if m.Kind == kvevents.MsgBatch && m.Seq >= target {
			break
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}

// TestReplayOnStart: a subscriber started next to an idle engine learns its
// cache from the replay buffer without any new event.
func TestReplayOnStart(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 13)
	for i := 0; i < 20; i++ {
		eng.step() // nobody is listening yet
	}
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint(), ReplayOnStart: true})
	v := newView()
	pump(t, sub, v, "the idle engine's state", func() bool { return v.last[0] == 19 && equalTo(v, eng)() })
	// Live batches continue the sequence (stepping until the slow-joining
	// SUB receives one; replay fills any the join missed).
	stepUntil(t, sub, v, func() bool { return sub.Stats().Received > 0 && v.last[0] == eng.pub.NextSeq()-1 }, eng)
	if st := sub.Stats(); st.Resets != 0 || st.LostHistory != 0 || !equalTo(v, eng)() {
		t.Fatalf("stats %+v", st)
	}

	// A buffer that no longer reaches back to 0 starts with lost history.
	short := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 5}, 14)
	for i := 0; i < 12; i++ {
		short.step()
	}
	sub2 := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: short.pub.Endpoint(), ReplayEndpoint: short.pub.ReplayEndpoint(), ReplayOnStart: true})
	v2 := newView()
	pump(t, sub2, v2, "the last 5 batches", func() bool { return v2.last[0] == 11 })
	if len(v2.lost) != 1 || v2.lost[0].From != 0 || v2.lost[0].Seq != 7 {
		t.Fatalf("lost %+v", v2.lost)
	}
}

// TestIdleProbe: batches lost at the end of a burst, and an engine that
// restarts and stays idle, are both caught without a new live message.
func TestIdleProbe(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 15)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint(), IdleProbe: 30 * time.Millisecond})
	v := newView()
	connect(t, sub, v, eng)
	for i := 0; i < 10; i++ {
		eng.step()
	}
	eng.pub.DropNext(3)
	for i := 0; i < 3; i++ {
		eng.step() // the tail of the burst never goes out live
	}
	pump(t, sub, v, "the lost tail", func() bool { return v.last[0] == eng.pub.NextSeq()-1 && equalTo(v, eng)() })

	eng.restart()
	eng.pub.DropNext(2)
	eng.step()
	eng.step()
	pump(t, sub, v, "the idle restart", func() bool { return len(v.resets) == 1 && v.last[0] == 1 && equalTo(v, eng)() })
	if st := sub.Stats(); st.Probes == 0 || st.LostHistory != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLiveDuplicate: a live batch that replay already delivered is skipped;
// the same seq with another payload is a restart.
func TestLiveDuplicate(t *testing.T) {
	payload := func(h uint64) []byte {
		return kvtest.AppendBatch(nil, &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{h}}}}, kvtest.ArrayForm)
	}
	pub, sub := joinedRawPub(t, payload(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base := sub.Stats()
	_, _ = pub.SendMessage("", seq8(1), payload(2))
	_, _ = pub.SendMessage("", seq8(1), payload(2)) // duplicate
	_, _ = pub.SendMessage("", seq8(1), payload(3)) // restart
	var kinds []kvevents.MessageKind
	for len(kinds) < 3 {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, m.Kind)
	}
	// batch 1; (duplicate skipped); reset; lost history 0..0 (no replay); batch 1'
	st := sub.Stats()
	if kinds[0] != kvevents.MsgBatch || kinds[1] != kvevents.MsgReset || kinds[2] != kvevents.MsgLostHistory || st.Duplicates-base.Duplicates != 1 {
		t.Fatalf("kinds %v, stats %+v (before %+v)", kinds, st, base)
	}
}

// TestLongReplaySlowConsumer: a replay longer than the ROUTER's default
// high-water mark, read by a consumer with a one-slot queue, arrives whole.
func TestLongReplaySlowConsumer(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 16)
	for i := 0; i < 3000; i++ {
		eng.step()
	}
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint(),
		ReplayOnStart: true, QueueSize: 1, ReplayTimeout: 500 * time.Millisecond})
	v := newView()
	pump(t, sub, v, "the whole buffer", func() bool { return v.last[0] == 2999 })
	if st := sub.Stats(); st.LostHistory != 0 || st.ReplayFailures != 0 || !equalTo(v, eng)() {
		t.Fatalf("stats %+v", st)
	}
}

// TestInprocAndIPC: non-TCP transports bind on the publisher side and work
// end to end (inproc within the process's shared context).
func TestInprocAndIPC(t *testing.T) {
	dir := t.TempDir()
	for _, eps := range [][2]string{
		{"inproc://kvevents-test", "inproc://kvevents-test-replay"},
		{"ipc://" + dir + "/events", "ipc://" + dir + "/replay"},
	} {
		eng := newFakeEngine(t, kvtest.PublisherConfig{Endpoint: eps[0], ReplayEndpoint: eps[1]}, 17)
		if eng.pub.Endpoint() != eps[0] || eng.pub.ReplayEndpoint() != eps[1] {
			t.Fatalf("endpoints %q %q", eng.pub.Endpoint(), eng.pub.ReplayEndpoint())
		}
		sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eps[0], ReplayEndpoint: eps[1]})
		v := newView()
		connect(t, sub, v, eng)
		eng.pub.DropNext(2)
		for i := 0; i < 5; i++ {
			eng.step()
		}
		pump(t, sub, v, eps[0], func() bool { return v.last[0] == eng.pub.NextSeq()-1 && equalTo(v, eng)() })
	}
}

// TestDPPortOffsets: rank r uses base port + r for both the event socket
// (here the subscriber binds and the engines connect) and the replay socket.
func TestDPPortOffsets(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for attempt := 0; attempt < 10; attempt++ {
		base, rbase := 20000+rng.IntN(20000), 40000+rng.IntN(20000)
		ep, rep := "tcp://127.0.0.1:"+strconv.Itoa(base), "tcp://127.0.0.1:"+strconv.Itoa(rbase)
		sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: ep, Bind: true, ReplayEndpoint: rep, DPSize: 3,
			PollInterval: 10 * time.Millisecond, Logger: discardLogger()})
		if err != nil {
			continue // a port was taken: try others
		}
		t.Cleanup(func() { _ = sub.Close() })
		var engines []*fakeEngine
		ok := true
		for r := 0; r < 3 && ok; r++ {
			pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: ep, ReplayEndpoint: rep, DPRank: r, Logger: discardLogger()})
			if err != nil {
				ok = false
				break
			}
			t.Cleanup(func() { _ = pub.Close() })
			want := "tcp://127.0.0.1:" + strconv.Itoa(base+r)
			if pub.Endpoint() != want || pub.ReplayEndpoint() != "tcp://127.0.0.1:"+strconv.Itoa(rbase+r) {
				t.Fatalf("rank %d endpoints %q %q", r, pub.Endpoint(), pub.ReplayEndpoint())
			}
			engines = append(engines, &fakeEngine{t: t, pub: pub, rank: r, rng: rand.New(rand.NewPCG(uint64(r), 9)), model: engineModel{}, next: uint64(r) << 40})
		}
		if !ok {
			_ = sub.Close()
			continue
		}
		v := newView()
		connect(t, sub, v, engines...)
		for _, e := range engines {
			e.pub.DropNext(1)
			e.step()
			e.step()
		}
		pump(t, sub, v, "all ranks", func() bool {
			for _, e := range engines {
				if v.last[e.rank] != e.pub.NextSeq()-1 {
					return false
				}
			}
			return equalTo(v, engines...)()
		})
		return
	}
	testutil.Need(t, errors.New("no free port range found in 10 attempts"), "a range of free consecutive loopback ports")
}

// boundPub binds a raw PUB socket on a free loopback port, closed at the
// test's end, and returns it with the endpoint a subscriber connects to.
func boundPub(t *testing.T) (*zmq.Socket, string) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(); _ = zctx.Term() })
	_ = pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	last, _ := pub.GetLastEndpoint()
	return pub, zmqep.Connectable(last)
}

// joinedRawPub binds a raw PUB socket (to send what no Publisher would),
// starts a subscriber on it, and sends ["", seq 0, first] until the
// subscription is up; every message of the join is drained.
func joinedRawPub(t *testing.T, first []byte) (*zmq.Socket, *kvevents.Subscriber) {
	t.Helper()
	return joinedRawPubCfg(t, first, kvevents.SubscriberConfig{})
}

// joinedRawPubCfg is joinedRawPub with a subscriber configured by cfg (its
// Endpoint is set to the raw PUB's).
func joinedRawPubCfg(t *testing.T, first []byte, cfg kvevents.SubscriberConfig) (*zmq.Socket, *kvevents.Subscriber) {
	t.Helper()
	pub, ep := boundPub(t)
	cfg.Endpoint = ep
	sub := newTestSubscriber(t, cfg)
	deadline := time.Now().Add(10 * time.Second)
	for sub.Stats().Received == 0 {
		if time.Now().After(deadline) {
			t.Fatal("subscriber never joined")
		}
		if _, err := pub.SendMessage("", seq8(0), first); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		_, _ = sub.Next(ctx)
		cancel()
	}
	for { // later copies of seq 0 are skipped as duplicates; drain until quiet
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := sub.Next(ctx)
		cancel()
		if err != nil {
			return pub, sub
		}
	}
}

// TestLiveStart: with LiveStart (kvmesh inspect events without
// --from-start) a rank's first live batch starts its stream; the batches
// still in the engine's buffer from before are not replayed, where they
// used to be printed at the first live batch (h-kvev finding 2). Gaps
// after it and the engine's new incarnation are replayed as usual. Without
// it (the sidecar) the first sight replays the buffer from 0, which is how
// a sidecar learns the cache of an engine that was already running.
func TestLiveStart(t *testing.T) {
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 17)
	for range 20 {
		eng.step() // before any subscriber: history
	}
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint(), LiveStart: true})
	v := newView()
	stepUntil(t, sub, v, func() bool { return len(v.kinds) > 0 }, eng) // one message
	if v.kinds[kvevents.MsgBatch] != 1 || v.last[0] < 20 || sub.Stats().Replayed != 0 {
		t.Fatalf("the stream starts with %v at seq %d (stats %+v); want the first live batch, past the 20 of history", v.kinds, v.last[0], sub.Stats())
	}

	// A gap after the start is replayed.
	eng.pub.DropNext(2)
	for range 3 {
		eng.step()
	}
	pump(t, sub, v, "the gap filled", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })
	if st := sub.Stats(); st.Replayed != 2 || st.LostHistory != 0 {
		t.Fatalf("stats %+v after a gap of 2", st)
	}
	// The engine's new incarnation is replayed from 0.
	eng.restart()
	eng.pub.DropNext(2)
	for range 3 {
		eng.step()
	}
	pump(t, sub, v, "the new incarnation", func() bool { return len(v.resets) == 1 && v.last[0] == 2 })
	if st := sub.Stats(); st.Replayed != 4 || st.LostHistory != 0 || !equalTo(v, eng)() {
		t.Fatalf("stats %+v after a restart whose first 2 batches went out only to the buffer", st)
	}

	// Idle probes leave a rank alone until its first live batch.
	at := eng.pub.NextSeq()
	sub3 := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint(), LiveStart: true, IdleProbe: time.Millisecond})
	v3 := newView()
	stepUntil(t, sub3, v3, func() bool { return len(v3.kinds) > 0 }, eng) // one message
	if v3.kinds[kvevents.MsgBatch] != 1 || v3.last[0] < at || sub3.Stats().Replayed != 0 {
		t.Fatalf("with idle probes the stream starts with %v at seq %d (stats %+v); want the first live batch, %d or later", v3.kinds, v3.last[0], sub3.Stats(), at)
	}

	// Without LiveStart, the first sight replays the buffer from 0.
	sub2 := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
	v2 := newView()
	stepUntil(t, sub2, v2, func() bool { return len(v2.kinds) > 0 }, eng) // one message
	if v2.kinds[kvevents.MsgBatch] != 1 || v2.last[0] != 0 {
		t.Fatalf("without LiveStart the stream starts with %v at seq %d, want the batch at 0", v2.kinds, v2.last[0])
	}
}
