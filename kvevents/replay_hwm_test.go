package kvevents_test

import (
	"context"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvmesh/kvmesh/kvevents"
	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

// The replay socket queues a whole replay while the consumer is busy, so an
// engine's ROUTER at ZMQ's default send high-water mark (1,000, vLLM's: it
// sets none on its replay socket) does not drop replies mid-replay. A
// ROUTER drops what it cannot queue; this one has ROUTER_MANDATORY, which
// makes its send block instead, so a queue too short shows as a send that
// times out, not as a race. 5,000 batches of 5 KiB are twice what the
// ROUTER's 1,000, a receive queue of ZMQ's default 1,000 and the loopback
// TCP buffers hold together (the send blocks at 2,500 with such a queue).
func TestReplayQueuedWhileConsumerBusy(t *testing.T) {
	const n = 5000
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zctx.Term() })
	bind := func(kind zmq.Type) (*zmq.Socket, string) {
		s, err := zctx.NewSocket(kind)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		_ = s.SetLinger(0)
		if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
			t.Fatal(err)
		}
		last, _ := s.GetLastEndpoint()
		return s, zmqep.Connectable(last)
	}
	_, pubEP := bind(zmq.PUB) // no live batch: only the replay
	router, replayEP := bind(zmq.ROUTER)
	if err := router.SetRouterMandatory(1); err != nil {
		t.Fatal(err)
	}
	if err := router.SetSndtimeo(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The consumer holds one batch in a one-slot queue and reads nothing
	// until the engine has sent the whole replay.
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: pubEP, ReplayEndpoint: replayEP,
		ReplayOnStart: true, QueueSize: 1, ReplayTimeout: time.Minute})

	if err := router.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	req, err := router.RecvMessageBytes(0) // [identity, "", start]
	if err != nil || len(req) != 3 {
		t.Fatalf("replay request %q: %v", req, err)
	}
	toks := make([]uint32, 1024)
	for i := range toks {
		toks[i] = 1 << 20 // 5 bytes of msgpack each
	}
	payload := kvtest.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockStored,
		BlockHashes: []uint64{1}, TokenIDs: toks, BlockSize: len(toks), Medium: "GPU"}}}, kvtest.ArrayForm)
	for seq := range uint64(n) {
		if _, err := router.SendMessage(req[0], "", seq8(seq), payload); err != nil {
			t.Fatalf("replay reply %d of %d: %v: the subscriber's replay socket stopped taking replies while its consumer was busy (an engine's ROUTER drops them)", seq, n, err)
		}
	}
	if _, err := router.SendMessage(req[0], "", seq8(1<<64-1), ""); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for seq := range uint64(n) {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Kind != kvevents.MsgBatch || m.Seq != seq {
			t.Fatalf("message %d: kind %v seq %d (stats %+v)", seq, m.Kind, m.Seq, sub.Stats())
		}
	}
	if st := sub.Stats(); st.LostHistory != 0 || st.ReplayFailures != 0 || st.Replayed != n {
		t.Fatalf("stats %+v", st)
	}
}
