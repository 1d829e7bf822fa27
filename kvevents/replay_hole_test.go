package kvevents_test

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvmesh/kvmesh/kvevents"
)

// holeyReplay runs a ROUTER that answers its k-th replay request (for
// start) with the batches answer(k, start) names, payload each, then the end
// marker. The starts asked for are sent on the returned channel.
func holeyReplay(t *testing.T, payload []byte, answer func(k int, start uint64) []uint64) (string, <-chan uint64) {
	t.Helper()
	starts := make(chan uint64, 16)
	ep := replayServer(t, func(sock *zmq.Socket, _ func() ([]byte, bool), quit <-chan struct{}) {
		poller := zmq.NewPoller()
		poller.Add(sock, zmq.POLLIN)
		for k := 0; ; {
			select {
			case <-quit:
				return
			default:
			}
			if polled, err := poller.Poll(10 * time.Millisecond); err != nil || len(polled) == 0 {
				continue
			}
			req, err := sock.RecvMessageBytes(0)
			if err != nil || len(req) != 3 || len(req[2]) != 8 {
				continue
			}
			start := binary.BigEndian.Uint64(req[2])
			select {
			case starts <- start:
			default:
			}
			for _, seq := range answer(k, start) {
				if _, err := sock.SendMessage(req[0], "", seq8(seq), payload); err != nil {
					break
				}
			}
			_, _ = sock.SendMessage(req[0], "", seq8(math.MaxUint64), "")
			k++
		}
	})
	return ep, starts
}

// quietPub binds a PUB socket that publishes nothing: the subscriber's
// batches come from replay alone.
func quietPub(t *testing.T) string {
	t.Helper()
	_, ep := boundPub(t)
	return ep
}

// seqRange is [from, to).
func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for q := from; q < to; q++ {
		s = append(s, q)
	}
	return s
}

// TestReplayHoleAskedAgain: a replay whose replies skip a range after
// starting in sequence lost them in transit (the engine's ROUTER drops
// replies past its send high-water mark; its buffer has no holes), so the
// subscriber asks again from the first missing seq (one earlier, to compare
// the last batch it delivered) instead of reporting lost history, which
// drops the rank's keys. The first exchange answers 0-2 and 5-7; the second,
// from 2, answers 2-7.
func TestReplayHoleAskedAgain(t *testing.T) {
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	replay, starts := holeyReplay(t, good, func(k int, start uint64) []uint64 {
		if k == 0 {
			return append(seqRange(start, 3), seqRange(5, 8)...)
		}
		return seqRange(start, 8)
	})
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: quietPub(t), ReplayEndpoint: replay, ReplayOnStart: true})
	v := newView()
	pump(t, sub, v, "batch 7", func() bool { l, ok := v.last[0]; return ok && l == 7 })
	if len(v.lost) != 0 {
		t.Fatalf("lost history %+v: the hole was not asked for again", v.lost)
	}
	if st := sub.Stats(); st.Replays != 2 || st.Replayed != 8 || st.LostHistory != 0 {
		t.Fatalf("stats %+v: want two exchanges, 8 batches replayed, nothing lost", st)
	}
	if a, b := <-starts, <-starts; a != 0 || b != 2 {
		t.Fatalf("replay requests from %d and %d, want 0 and 2 (the last delivered, 2, to compare)", a, b)
	}
}

// TestReplayHoleAskedAgainBounded: an engine whose every replay skips the
// same range is asked again a few times, then the range is lost history as
// before and the batches after it are delivered.
func TestReplayHoleAskedAgainBounded(t *testing.T) {
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	replay, _ := holeyReplay(t, good, func(_ int, start uint64) []uint64 {
		return append(seqRange(start, 3), seqRange(5, 8)...)
	})
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: quietPub(t), ReplayEndpoint: replay, ReplayOnStart: true})
	v := newView()
	pump(t, sub, v, "batch 7", func() bool { l, ok := v.last[0]; return ok && l == 7 })
	if len(v.lost) != 1 || v.lost[0].From != 3 || v.lost[0].Seq != 5 {
		t.Fatalf("lost history %+v, want [3, 5)", v.lost)
	}
	if st := sub.Stats(); st.Replays != 4 || st.LostHistory != 1 {
		t.Fatalf("stats %+v: want four exchanges (three asking again) and one loss", st)
	}
}
