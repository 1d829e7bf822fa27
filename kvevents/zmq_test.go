package kvevents_test

import (
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

// engineModel is the block-hash set per rank that a batch stream implies.
type engineModel map[int]map[uint64]bool

func (m engineModel) rank(r int) map[uint64]bool {
	if m[r] == nil {
		m[r] = map[uint64]bool{}
	}
	return m[r]
}

func (m engineModel) apply(r int, b *kvevents.Batch) {
	set := m.rank(r)
	for _, e := range b.Events {
		switch e.Kind {
		case kvevents.BlockStored:
			for _, h := range e.BlockHashes {
				set[h] = true
			}
		case kvevents.BlockRemoved:
			for _, h := range e.BlockHashes {
				delete(set, h)
			}
		case kvevents.AllBlocksCleared:
			clear(set)
		}
	}
}

// fakeEngine drives a Publisher with random but valid batches and keeps the
// model of what it published (the publisher's view).
type fakeEngine struct {
	t     *testing.T
	pub   *kvtest.Publisher
	rank  int
	rng   *rand.Rand
	live  []uint64 // hashes currently stored
	model engineModel
	next  uint64
	log   []kvevents.Batch // every batch published since the last restart, by seq
}

func newFakeEngine(t *testing.T, cfg kvtest.PublisherConfig, seed uint64) *fakeEngine {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:*"
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	pub, err := kvtest.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return &fakeEngine{t: t, pub: pub, rank: cfg.DPRank, rng: rand.New(rand.NewPCG(seed, 7)), model: engineModel{}, next: seed << 32}
}

func (f *fakeEngine) step() {
	f.t.Helper()
	b := kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9}
	n := 1 + f.rng.IntN(3)
	for i := 0; i < n; i++ {
		switch x := f.rng.IntN(20); {
		case x == 0:
			b.Events = append(b.Events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
			f.live = f.live[:0]
		case x < 6 && len(f.live) > 0:
			j := f.rng.IntN(len(f.live))
			b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{f.live[j]}, Medium: "GPU"})
			f.live = append(f.live[:j], f.live[j+1:]...)
		default:
			e := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 4, Medium: "GPU"}
			for k := 0; k < 1+f.rng.IntN(3); k++ {
				f.next++
				e.BlockHashes = append(e.BlockHashes, f.next)
				e.TokenIDs = append(e.TokenIDs, 1, 2, 3, uint32(f.next))
				f.live = append(f.live, f.next)
			}
			b.Events = append(b.Events, e)
		}
	}
	if _, err := f.pub.Publish(&b); err != nil {
		f.t.Fatal(err)
	}
	f.model.apply(f.rank, &b)
	f.log = append(f.log, b)
}

func (f *fakeEngine) restart() {
	f.pub.Restart()
	f.live = f.live[:0]
	f.log = nil
	clear(f.model.rank(f.rank))
}

// view is the consumer side: what a sidecar would hold after each message.
type view struct {
	model  engineModel
	kinds  map[kvevents.MessageKind]int
	lost   []kvevents.Message
	resets []kvevents.Message
	last   map[int]uint64
}

func newView() *view {
	return &view{model: engineModel{}, kinds: map[kvevents.MessageKind]int{}, last: map[int]uint64{}}
}

func (v *view) handle(t *testing.T, m kvevents.Message) {
	t.Helper()
	v.kinds[m.Kind]++
	switch m.Kind {
	case kvevents.MsgBatch:
		if prev, ok := v.last[m.Rank]; ok && m.Seq != prev+1 {
			t.Fatalf("rank %d: batch seq %d after %d without a signal", m.Rank, m.Seq, prev)
		}
		v.last[m.Rank] = m.Seq
		v.model.apply(m.Rank, m.Batch)
	case kvevents.MsgReset:
		clear(v.model.rank(m.Rank))
		delete(v.last, m.Rank)
		v.resets = append(v.resets, m)
	case kvevents.MsgLostHistory:
		clear(v.model.rank(m.Rank))
		v.last[m.Rank] = m.Seq - 1
		v.lost = append(v.lost, m)
	}
}

// pump reads messages into v until cond holds.
func pump(t *testing.T, sub *kvevents.Subscriber, v *view, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (stats %+v)", what, sub.Stats())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		m, err := sub.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		v.handle(t, m)
	}
}

func newTestSubscriber(t *testing.T, cfg kvevents.SubscriberConfig) *kvevents.Subscriber {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	sub, err := kvevents.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// connect publishes until the subscriber has seen every engine (the PUB/SUB
// join is asynchronous; replay covers whatever the late join missed).
func connect(t *testing.T, sub *kvevents.Subscriber, v *view, engines ...*fakeEngine) {
	t.Helper()
	for _, e := range engines {
		e.step()
	}
	stepUntil(t, sub, v, func() bool {
		for _, e := range engines {
			if v.model[e.rank] == nil {
				return false
			}
		}
		return equalTo(v, engines...)()
	}, engines...)
}

// stepUntil reads messages into v until cond holds, making the engines step
// whenever nothing arrives for a while.
func stepUntil(t *testing.T, sub *kvevents.Subscriber, v *view, cond func() bool, engines ...*fakeEngine) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition never held (stats %+v)", sub.Stats())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		m, err := sub.Next(ctx)
		cancel()
		if err != nil {
			for _, e := range engines {
				e.step()
			}
			continue
		}
		v.handle(t, m)
	}
}

func equalTo(v *view, engines ...*fakeEngine) func() bool {
	return func() bool {
		for _, e := range engines {
			if !maps.Equal(v.model.rank(e.rank), e.model.rank(e.rank)) {
				return false
			}
		}
		return true
	}
}

func seq8(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
