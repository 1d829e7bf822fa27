package learn

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Rates is cached per engine until the sums change; a cached estimate is
// never stale: after every change (own samples, a peer's share, a peer or
// an engine forgotten) each engine's Rates is what a fresh fit gives.
func TestRatesCacheNeverStale(t *testing.T) {
	l, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 61))
	engines := []string{"e0", "e1", "e2", "e3"}
	check := func(step int, op string) {
		t.Helper()
		for _, e := range engines {
			got := l.Rates(e)
			again := l.Rates(e) // from the cache when nothing changed
			l.mu.Lock()
			fresh := l.rates(e)
			l.mu.Unlock()
			if got != fresh || again != fresh {
				t.Fatalf("step %d (%s), engine %s: Rates %+v then %+v, a fresh fit %+v", step, op, e, got, again, fresh)
			}
		}
	}
	check(-1, "start")
	for step := range 400 {
		e := engines[r.IntN(len(engines))]
		var op string
		switch k := r.IntN(10); {
		case k < 4:
			op = "prefill"
			l.ObservePrefill(e, 100+r.IntN(8000), time.Duration(20+r.IntN(2000))*time.Millisecond)
		case k < 7:
			op = "decode"
			l.ObserveDecode(e, float64(1+r.IntN(32)), float64(r.IntN(200000)), time.Duration(10+r.IntN(40))*time.Millisecond, 1+r.IntN(20))
		case k < 8:
			op = "peer share"
			peer.ObservePrefill(e, 100+r.IntN(8000), time.Duration(20+r.IntN(2000))*time.Millisecond)
			own, pooled := peer.Own(nil)
			if err := l.SetPeer("p", pooled, own); err != nil {
				t.Fatal(err)
			}
		case k < 9:
			op = "forget peer"
			l.ForgetPeer("p")
		default:
			op = "forget " + e
			l.Forget(e)
		}
		check(step, fmt.Sprint(op))
	}
}
