package des

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// CapacitySplit is a P/D split and the highest constant arrival rate
// (req/s) at which a static deployment of it keeps the SLO target (as
// loadtest/analysis/clairvoyant_scale.py's capacity step measures it).
type CapacitySplit struct {
	Prefill, Decode int
	Rate            float64
}

// ParseCapacityTable reads "P/D=RATE,..." (e.g. "1/1=2.67,2/1=5.39").
func ParseCapacityTable(s string) ([]CapacitySplit, error) {
	var out []CapacitySplit
	for _, part := range strings.Split(s, ",") {
		sp, r, ok := strings.Cut(strings.TrimSpace(part), "=")
		ps, ds, ok2 := strings.Cut(sp, "/")
		p, err1 := strconv.Atoi(ps)
		d, err2 := strconv.Atoi(ds)
		rate, err3 := strconv.ParseFloat(r, 64)
		// Written so that NaN, which compares false with everything, fails.
		if !ok || !ok2 || err1 != nil || err2 != nil || err3 != nil || p < 1 || d < 1 || !(rate > 0) || math.IsInf(rate, 0) {
			return nil, fmt.Errorf("capacity table %q: want P/D=RATE entries, P and D ≥ 1, RATE a finite number > 0", part)
		}
		out = append(out, CapacitySplit{p, d, rate})
	}
	return out, nil
}

// CapacityScaler is an analysis autoscaler, not a controller: it sizes the
// cluster as the cheapest split of a measured capacity table that serves
// (1 + Headroom) × a rate, with no windows, tolerance, rate limits or
// cool-down (it scales both ways at once). Reactive (NewCapacityScaler
// with no requests) the rate is the ingress window's arrival rate, what a
// real autoscaler sees: the best a controller that knows every split's
// capacity exactly and reacts at once can do with the window's lag and the
// start-up delay. Clairvoyant (given the trace's requests: the future) it
// sizes during minute k for the larger split of minute k's and minute
// k+1's arrival rates, so the engines a minute needs are ready when it
// starts (engines start in the start-up delay, here at most a minute).
type CapacityScaler struct {
	splits   []CapacitySplit // fewest engines first; among equal, highest rate first
	headroom float64
	minutes  []float64 // clairvoyant: arrivals per second in each minute (nil: reactive)
}

// NewCapacityScaler validates the table; reqs non-nil makes it clairvoyant.
func NewCapacityScaler(splits []CapacitySplit, headroom float64, reqs []workload.Request) (*CapacityScaler, error) {
	if len(splits) == 0 || !(headroom > -1) || math.IsInf(headroom, 0) {
		return nil, fmt.Errorf("%w: capacity scaler: a table and a headroom > -1 are required", ErrConfig)
	}
	s := &CapacityScaler{splits: slices.Clone(splits), headroom: headroom}
	slices.SortStableFunc(s.splits, func(a, b CapacitySplit) int {
		if n := (a.Prefill + a.Decode) - (b.Prefill + b.Decode); n != 0 {
			return n
		}
		switch {
		case a.Rate > b.Rate:
			return -1
		case a.Rate < b.Rate:
			return 1
		}
		return 0
	})
	if reqs != nil {
		s.minutes = []float64{}
		for _, r := range reqs {
			m := int(r.Arrival / time.Minute)
			for len(s.minutes) <= m {
				s.minutes = append(s.minutes, 0)
			}
			s.minutes[m] += 1.0 / 60
		}
	}
	return s, nil
}

// Name implements Autoscaler.
func (s *CapacityScaler) Name() string {
	if s.minutes != nil {
		return "capacity-clairvoyant"
	}
	return "capacity-reactive"
}

// Setting implements Autoscaler.
func (s *CapacityScaler) Setting() string {
	var t []string
	for _, c := range s.splits {
		t = append(t, fmt.Sprintf("%d/%d %.3g", c.Prefill, c.Decode, c.Rate))
	}
	return fmt.Sprintf("headroom %+.0f %% (%s req/s)", s.headroom*100, strings.Join(t, ", "))
}

// split is the cheapest split serving rate req/s, else the one with the
// highest capacity.
func (s *CapacityScaler) split(rate float64) CapacitySplit {
	best := s.splits[0]
	for _, c := range s.splits {
		if rate*(1+s.headroom) <= c.Rate {
			return c
		}
		if c.Rate > best.Rate {
			best = c
		}
	}
	return best
}

// Decide implements Autoscaler.
func (s *CapacityScaler) Decide(now time.Duration, sig *Signals) (int, int) {
	if s.minutes == nil {
		c := s.split(sig.ArrivalRate)
		return c.Prefill, c.Decode
	}
	at := func(m int) float64 {
		if m < len(s.minutes) {
			return s.minutes[m]
		}
		return 0
	}
	m := int(now / time.Minute)
	a, b := s.split(at(m)), s.split(at(m+1))
	return max(a.Prefill, b.Prefill), max(a.Decode, b.Decode)
}
