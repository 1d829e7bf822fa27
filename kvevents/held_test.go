package kvevents_test

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestHeldLoopIsNotARestart: the socket loop is held (a paused process, CPU
// starvation) for longer than IdleProbe while more than the subscriber's
// history (1,024 batches) arrives. On release the rank had input waiting, so
// it is not idle: no probe replays ahead of the queued live batches. That
// probe used to deliver them by replay first, the live copies then looked
// like a sequence gone backwards, and the engine's state was dropped and
// rebuilt from 0 (orphaning every block once the engine's buffer no longer
// reached 0).
//
// The pause is not waited out: the hook ages the rank's last message past
// IdleProbe (an hour, so no probe depends on elapsed time) before it lets
// the loop go, once the burst is observed queued on the SUB socket.
func TestHeldLoopIsNotARestart(t *testing.T) {
	const idle, burst = time.Hour, 1500
	eng := newFakeEngine(t, kvtest.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:*"}, 21)
	var arm atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	ask := make(chan chan bool)
	hook := func(s *kvevents.Subscriber) {
		if !arm.CompareAndSwap(true, false) {
			return
		}
		close(held)
		for {
			select {
			case reply := <-ask:
				reply <- kvevents.PendingInput(s, 0)
			case <-release:
				// The fault is the pause itself: the rank must look
				// idle on release.
				kvevents.AgeLastMsg(s, 0, 2*idle)
				return
			}
		}
	}
	sub := newTestSubscriber(t, kvevents.WithLoopHook(kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(),
		ReplayEndpoint: eng.pub.ReplayEndpoint(), IdleProbe: idle}, hook))
	v := newView()
	connect(t, sub, v, eng)
	pump(t, sub, v, "the first batches", func() bool { return v.last[0] == eng.pub.NextSeq()-1 })

	arm.Store(true)
	select {
	case <-held:
	case <-time.After(15 * time.Second):
		t.Fatal("the socket loop never reached the hook")
	}
	base := sub.Stats()
	for i := 0; i < burst; i++ {
		eng.step()
	}
	pending := func() bool {
		reply := make(chan bool)
		ask <- reply
		return <-reply
	}
	testutil.WaitFor(t, 15*time.Second, "live batches queued on the held loop", pending)
	close(release)

	pump(t, sub, v, "every batch of the burst, and its live copy", func() bool {
		return v.last[0] == eng.pub.NextSeq()-1 && sub.Stats().Received-base.Received == burst
	})
	st := sub.Stats()
	if st.Resets != base.Resets || st.LostHistory != base.LostHistory || len(v.resets) != 0 || len(v.lost) != 0 {
		t.Fatalf("the held loop was taken for a restart: stats %+v (before %+v)", st, base)
	}
	if st.Replayed != base.Replayed {
		t.Fatalf("queued batches were replayed ahead of the live ones: stats %+v (before %+v)", st, base)
	}
	if !equalTo(v, eng)() {
		t.Fatal("the view differs from the engine")
	}
}

// TestLateLiveCopiesAfterLongReplay: a replay delivered more than histSize
// batches ahead of their live copies, which then arrive (a probe that
// overtook messages still in flight). Their history slots hold newer seqs,
// so payloads cannot be compared; the engine's replay of the last delivered
// batch shows the history is the same, so they are duplicates, not a
// restart (one exchange for the whole run). A real restart, whose engine no
// longer has the last batch, is still one.
func TestLateLiveCopiesAfterLongReplay(t *testing.T) {
	const n = 1500
	payload := func(h uint64) []byte {
		return kvtest.AppendBatch(nil, &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{h}}}}, kvtest.ArrayForm)
	}
	end := [][]byte{{}, seq8(math.MaxUint64), {}}
	var first [][][]byte // the gap's exchange: seqs 1..n-1
	for i := uint64(1); i < n; i++ {
		first = append(first, [][]byte{{}, seq8(i), payload(i)})
	}
	first = append(first, end)
	replay := scriptedReplay(t, [][][][]byte{
		first,
		{{{}, seq8(n), payload(n)}, end}, // the check: the engine still has seq n as delivered
		{end},                            // after the restart: the engine has nothing from seq n+2 on
	})
	pub, sub := joinedRawPubCfg(t, payload(0), kvevents.SubscriberConfig{ReplayEndpoint: replay})
	v := newView()
	v.last[0] = 0
	if _, err := pub.SendMessage("", seq8(n), payload(n)); err != nil { // a gap: 1..n-1 replayed
		t.Fatal(err)
	}
	pump(t, sub, v, "the replayed history", func() bool { return v.last[0] == n })
	base := sub.Stats()
	for _, seq := range []uint64{3, 4, 5} { // late live copies
		if _, err := pub.SendMessage("", seq8(seq), payload(seq)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.SendMessage("", seq8(n+1), payload(n+1)); err != nil {
		t.Fatal(err)
	}
	pump(t, sub, v, "the batch after the late copies", func() bool { return v.last[0] == n+1 })
	st := sub.Stats()
	if len(v.resets) != 0 || st.Resets != 0 || st.Duplicates-base.Duplicates != 3 || st.Replays-base.Replays != 1 {
		t.Fatalf("late copies: resets %+v, stats %+v (before %+v): want 3 duplicates from one exchange", v.resets, st, base)
	}

	// The engine restarts: seq 2 of the new incarnation, another payload.
	if _, err := pub.SendMessage("", seq8(2), payload(1<<40)); err != nil {
		t.Fatal(err)
	}
	pump(t, sub, v, "the restart", func() bool { return len(v.resets) == 1 && v.last[0] == 2 })
}
