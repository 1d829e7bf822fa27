package workload

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestDiurnalShapeAndDeterminism(t *testing.T) {
	d := Diurnal{Duration: 60 * time.Minute, PeakRate: 8, TroughRate: 1, Noise: -1, BurstFactor: -1, Seed: 3}
	a, err := d.Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := d.Generate()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("lengths %d, %d", len(a), len(b))
	}
	for i := range a {
		if a[i].Arrival != b[i].Arrival || a[i].PromptTokens != b[i].PromptTokens || a[i].OutputTokens != b[i].OutputTokens ||
			!slices.Equal(a[i].Prompt(), b[i].Prompt()) {
			t.Fatalf("request %d differs between runs of the same seed", i)
		}
	}
	// Arrivals per 6-minute bucket: the peak bucket (at 0.55 of the day)
	// has several times the first bucket's.
	var buckets [10]int
	for _, r := range a {
		if r.Arrival < 0 || r.Arrival >= d.Duration || len(r.Prompt()) != r.PromptTokens {
			t.Fatalf("request %+v out of range or prompt length wrong", r)
		}
		buckets[int(r.Arrival/(6*time.Minute))]++
	}
	if buckets[5] < 3*buckets[0] || buckets[5] < 3*buckets[9] {
		t.Fatalf("no diurnal shape: %v", buckets)
	}
	d.Seed = 4
	c, _ := d.Generate()
	if len(c) == len(a) && c[0].Arrival == a[0].Arrival {
		t.Fatal("another seed gave the same trace")
	}
}

func TestDiurnalBurstAndSharedPrefixes(t *testing.T) {
	d := Diurnal{Duration: 20 * time.Minute, PeakRate: 2, TroughRate: 2, Noise: -1, BurstAt: 0.5, BurstLength: 2 * time.Minute, BurstFactor: 4,
		Mix: LongPromptMix{Prefixes: 4, PrefixTokens: 64, OwnTokens: 32, OutputTokens: 8}}
	reqs, err := d.Generate()
	if err != nil {
		t.Fatal(err)
	}
	in, before := 0, 0
	prefix := map[int][]uint32{}
	for _, r := range reqs {
		switch {
		case r.Arrival >= 10*time.Minute && r.Arrival < 12*time.Minute:
			in++
		case r.Arrival >= 8*time.Minute && r.Arrival < 10*time.Minute:
			before++
		}
		p := r.Prompt()[:64]
		if q, ok := prefix[r.Group]; ok && !slices.Equal(p, q) {
			t.Fatalf("group %d has two prefixes", r.Group)
		}
		prefix[r.Group] = p
	}
	if in < 2*before {
		t.Fatalf("burst not visible: %d in the burst vs %d before", in, before)
	}
	if len(prefix) < 2 {
		t.Fatalf("only %d prefix groups used", len(prefix))
	}
}

func TestBurstyHasBursts(t *testing.T) {
	b := Bursty{Duration: 60 * time.Minute, BaseRate: 1, BurstFactor: 4, Noise: -1, Seed: 2}
	eps := b.Bursts()
	if len(eps) == 0 {
		t.Fatal("no bursts")
	}
	reqs, err := b.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var inB, inBase float64
	var lenB time.Duration
	for _, e := range eps {
		lenB += e[1] - e[0]
	}
	for _, r := range reqs {
		burst := false
		for _, e := range eps {
			burst = burst || (r.Arrival >= e[0] && r.Arrival < e[1])
		}
		if burst {
			inB++
		} else {
			inBase++
		}
	}
	rb, r0 := inB/lenB.Seconds(), inBase/(b.Duration-lenB).Seconds()
	if rb < 2.5*r0 {
		t.Fatalf("burst rate %.2f vs base %.2f", rb, r0)
	}
	again, _ := b.Generate()
	if len(again) != len(reqs) || again[len(again)-1].Arrival != reqs[len(reqs)-1].Arrival {
		t.Fatal("not deterministic")
	}
}

func TestDiurnalValidate(t *testing.T) {
	for _, d := range []Diurnal{{PeakRate: 1, TroughRate: 2}, {PeakAt: 1.5}, {Mix: LongPromptMix{Prefixes: -1}}, {TroughRate: -1}} {
		if _, err := d.Generate(); !errors.Is(err, ErrBadWorkload) {
			t.Errorf("%+v: err %v", d, err)
		}
	}
	if _, err := (Bursty{BurstFactor: 0.5}).Generate(); !errors.Is(err, ErrBadWorkload) {
		t.Errorf("bursty factor < 1 accepted: %v", err)
	}
}
