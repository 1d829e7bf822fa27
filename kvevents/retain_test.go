package kvevents

import (
	"log/slog"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// removedBatch encodes a batch of n BlockRemoved events of one hash each,
// as vLLM sends when it evicts n blocks in one step.
func removedBatch(t *testing.T, n int) []byte {
	t.Helper()
	evs := make([]any, n)
	for i := range evs {
		evs[i] = []any{"BlockRemoved", []uint64{uint64(i) + 1}, "GPU"}
	}
	b, err := msgpack.Marshal([]any{1.0, evs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Once consumed, the decode slots keep at most ringKeepBytes of decoded
// capacity, summed over the ring: a ring whose every slot once decoded a
// batch of 2,000 evictions (600 KB decoded from 20 KB on the wire) kept
// them all whatever came after (here 64 slots, 39 MB; with the old default
// queue, 1,026 slots, 620 MB).
func TestRingKeepsBoundedCapacity(t *testing.T) {
	const slots = 64
	s := &Subscriber{
		cfg:  SubscriberConfig{Logger: slog.New(slog.DiscardHandler)},
		out:  make(chan Message, 4*slots),
		ring: make([]Batch, slots),
		kept: make([]int, slots),
		quit: make(chan struct{}),
	}
	rs := &rankState{}
	big, small := removedBatch(t, 2000), removedBatch(t, 1)
	seq := uint64(0)
	deliverAll := func(payload []byte, want int) {
		for range slots {
			if err := s.deliver(rs, seq, payload, false); err != nil {
				t.Fatal(err)
			}
			seq++
			m := <-s.out
			if m.Kind != MsgBatch || len(m.Batch.Events) != want {
				t.Fatalf("message %v with %d events, want a batch of %d", m.Kind, len(m.Batch.Events), want)
			}
		}
	}
	check := func(when string) {
		sum := 0
		for i := range s.ring {
			if got := s.ring[i].retainedBytes(); got != s.kept[i] {
				t.Fatalf("%s: slot %d keeps %d bytes, counted %d", when, i, got, s.kept[i])
			}
			sum += s.kept[i]
		}
		if sum != s.keptSum {
			t.Fatalf("%s: slots keep %d bytes, sum counted %d", when, sum, s.keptSum)
		}
	}
	deliverAll(big, 2000) // while queued, the batches are the queue's contents
	check("after big batches")
	if s.keptSum <= ringKeepBytes {
		t.Fatalf("the ring keeps %d bytes after %d batches of 2,000 evictions: the test needs more than %d", s.keptSum, slots, ringKeepBytes)
	}
	deliverAll(small, 1)
	check("after small batches")
	if s.keptSum > ringKeepBytes {
		t.Fatalf("after small batches the ring keeps %d bytes, want ≤ %d", s.keptSum, ringKeepBytes)
	}
}
