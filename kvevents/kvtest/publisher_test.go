package kvtest

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"

	zmq "github.com/pebbe/zmq4"
)

func rawSocket(t *testing.T, kind zmq.Type, connect string) *zmq.Socket {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := zctx.NewSocket(kind)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(5 * time.Second)
	t.Cleanup(func() { _ = s.Close(); _ = zctx.Term() })
	if err := s.Connect(connect); err != nil {
		t.Fatal(err)
	}
	return s
}

func seq8(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// TestPublisherWire checks the exact frames of live messages and of both
// replay layouts, as a raw SUB and DEALER see them.
func TestPublisherWire(t *testing.T) {
	for _, layout := range []ReplayLayout{ReplayWithTopic, ReplayLegacy} {
		pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*",
			Topic: "kv-events", Layout: layout, DPRank: 2, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		sub := rawSocket(t, zmq.SUB, pub.Endpoint())
		_ = sub.SetSubscribe("")
		batch := kvevents.Batch{TS: 1.25, Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{7}, Medium: "GPU"}}}
		withRank := batch
		withRank.DPRank, withRank.HasDPRank = 2, true
		wantPayload := AppendBatch(nil, &withRank, ArrayForm)

		// Live: publish until the slow-joining SUB sees a message.
		var live [][]byte
		for live == nil {
			if _, err := pub.Publish(&batch); err != nil {
				t.Fatal(err)
			}
			p := zmq.NewPoller()
			p.Add(sub, zmq.POLLIN)
			if ready, _ := p.Poll(10 * time.Millisecond); len(ready) > 0 {
				live, _ = sub.RecvMessageBytes(0)
			}
		}
		if len(live) != 3 || string(live[0]) != "kv-events" || len(live[1]) != 8 || !bytes.Equal(live[2], wantPayload) {
			t.Fatalf("live frames %q", live)
		}
		last := pub.NextSeq() - 1

		dealer := rawSocket(t, zmq.DEALER, pub.ReplayEndpoint())
		if _, err := dealer.SendMessage("", seq8(last)); err != nil {
			t.Fatal(err)
		}
		reply, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		end, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		ff := bytes.Repeat([]byte{0xff}, 8)
		switch layout {
		case ReplayWithTopic:
			if len(reply) != 4 || len(reply[0]) != 0 || string(reply[1]) != "kv-events" || !bytes.Equal(reply[2], seq8(last)) || !bytes.Equal(reply[3], wantPayload) {
				t.Fatalf("topic-layout reply %q", reply)
			}
			if len(end) != 4 || len(end[0]) != 0 || len(end[1]) != 0 || !bytes.Equal(end[2], ff) || len(end[3]) != 0 {
				t.Fatalf("topic-layout end %q", end)
			}
		case ReplayLegacy:
			if len(reply) != 3 || len(reply[0]) != 0 || !bytes.Equal(reply[1], seq8(last)) || !bytes.Equal(reply[2], wantPayload) {
				t.Fatalf("legacy reply %q", reply)
			}
			if len(end) != 3 || len(end[0]) != 0 || !bytes.Equal(end[1], ff) || len(end[2]) != 0 {
				t.Fatalf("legacy end %q", end)
			}
		}
		// A malformed request gets just the end marker.
		if _, err := dealer.SendMessage("", "bad"); err != nil {
			t.Fatal(err)
		}
		if end2, err := dealer.RecvMessageBytes(0); err != nil || len(end2[len(end2)-1]) != 0 {
			t.Fatalf("reply to a malformed request: %q, %v", end2, err)
		}
		if st := pub.Stats(); st.ReplayRequests != 2 || st.ReplayedSent != 1 {
			t.Fatalf("stats %+v", st)
		}
	}
}

// TestPublisherBufferBound: the replay buffer keeps the last BufferSteps
// batches, and a request older than that starts at the oldest kept.
func TestPublisherBufferBound(t *testing.T) {
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 3, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// Port 0 binds a free port and reports it (ZMQ LAST_ENDPOINT).
	for _, ep := range []string{pub.Endpoint(), pub.ReplayEndpoint()} {
		if _, port, ok := zmqep.SplitTCP(ep); !ok || port == "0" || port == "*" {
			t.Fatalf("endpoint %q does not name the bound port", ep)
		}
	}
	for i := 0; i < 10; i++ {
		if s, err := pub.Publish(&kvevents.Batch{}); err != nil || s != uint64(i) {
			t.Fatalf("seq %d, %v", s, err)
		}
	}
	got := pub.collect(nil, 0)
	if len(got) != 3 || got[0].seq != 7 || got[2].seq != 9 {
		t.Fatalf("buffer %+v", got)
	}
	if got := pub.collect(nil, 9); len(got) != 1 || got[0].seq != 9 {
		t.Fatalf("from 9: %+v", got)
	}
	pub.Restart()
	if pub.NextSeq() != 0 || len(pub.collect(nil, 0)) != 0 {
		t.Fatal("restart must empty the buffer and restart the sequence")
	}
}

// TestPublisherDropRateDeterministic: the same seed drops the same batches.
func TestPublisherDropRateDeterministic(t *testing.T) {
	drops := func() []uint64 {
		pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", DropRate: 0.3, DropSeed: 42, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		var out []uint64
		for i := 0; i < 100; i++ {
			before := pub.Stats().Dropped
			seq, _ := pub.Publish(&kvevents.Batch{})
			if pub.Stats().Dropped > before {
				out = append(out, seq)
			}
		}
		return out
	}
	a, b := drops(), drops()
	if len(a) < 10 || len(a) > 50 || !slices.Equal(a, b) {
		t.Fatalf("drops %v vs %v", a, b)
	}
}

func BenchmarkPublish(b *testing.B) {
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	batch := benchBatch()
	batch.HasDPRank = false
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pub.Publish(batch); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCloseFreesPorts: once Close returns, the ports a publisher or a
// binding subscriber listened on can be bound again at once (an engine or
// sidecar restarting on the same ports). A socket's own Close is
// asynchronous in ZMQ; without terminating the context, rebinding raced it.
func TestCloseFreesPorts(t *testing.T) {
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ep, rep := pub.Endpoint(), pub.ReplayEndpoint()
	for i := 0; i < 25; i++ {
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
		if pub, err = NewPublisher(PublisherConfig{Endpoint: ep, ReplayEndpoint: rep, Logger: discardLogger()}); err != nil {
			t.Fatalf("publisher rebind %d after Close: %v", i, err)
		}
	}
	_ = pub.Close()

	cfg := kvevents.SubscriberConfig{Endpoint: "tcp://127.0.0.1:*", Bind: true, Logger: discardLogger()}
	sub, err := kvevents.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = sub.Endpoints()[0]
	for i := 0; i < 25; i++ {
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		if sub, err = kvevents.NewSubscriber(cfg); err != nil {
			t.Fatalf("subscriber rebind %d after Close: %v", i, err)
		}
	}
	_ = sub.Close()
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// benchBatch is a batch like a busy engine step: 8 stored events of 4
// blocks, 4 removed.
func benchBatch() *kvevents.Batch {
	b := &kvevents.Batch{TS: 1757500000.25, HasDPRank: true}
	tok := uint32(1000)
	for r := 0; r < 8; r++ {
		e := kvevents.Event{Kind: kvevents.BlockStored, HasParent: r%2 == 1, ParentHash: uint64(r) * 0x9e3779b97f4a7c15, BlockSize: 16, Medium: "GPU",
			HasGroupIdx: true, SpecKind: "full_attention"}
		for k := 0; k < 4; k++ {
			e.BlockHashes = append(e.BlockHashes, uint64(r*4+k+1)*0xbf58476d1ce4e5b9)
			for j := 0; j < 16; j++ {
				e.TokenIDs = append(e.TokenIDs, tok%128000)
				tok += 7919
			}
		}
		b.Events = append(b.Events, e)
	}
	for r := 0; r < 4; r++ {
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{uint64(r+100) * 0x94d049bb133111eb, uint64(r + 7)}, Medium: "GPU"})
	}
	return b
}

// The replay ring's entries do not keep the biggest batch they ever held:
// an entry reused for a batch far smaller lets the old payload go (the
// simulator's --replay-buffer is 10,000 entries).
func TestReplayRingDoesNotKeepBigPayloads(t *testing.T) {
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 4, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	big := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16}
	for i := range 4096 {
		big.BlockHashes = append(big.BlockHashes, uint64(i)+1)
	}
	small := kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{7}}
	for _, ev := range []kvevents.Event{big, big, big, big, small, small, small, small} {
		if _, err := pub.Publish(&kvevents.Batch{Events: []kvevents.Event{ev}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, e := range pub.ring {
		if cap(e.payload) > 1024 {
			t.Fatalf("ring entry %d keeps %d bytes for a %d-byte batch", i, cap(e.payload), len(e.payload))
		}
	}
}
