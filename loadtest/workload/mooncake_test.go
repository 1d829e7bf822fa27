package workload

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestMooncakeRateScale pins RateScale's contract: 0 is the documented
// default (1), any other non-positive or non-finite scale is an error.
func TestMooncakeRateScale(t *testing.T) {
	for _, rs := range []float64{0, 1} {
		reqs, err := Mooncake{RateScale: rs}.Read(strings.NewReader(trace))
		if err != nil {
			t.Fatalf("rate scale %v: %v", rs, err)
		}
		if got := reqs[2].Arrival; got != 2*time.Second {
			t.Fatalf("rate scale %v: last arrival %v, want 2s as recorded", rs, got)
		}
	}
	reqs, err := Mooncake{RateScale: 4}.Read(strings.NewReader(trace))
	if err != nil || reqs[1].Arrival != 2500*time.Microsecond || reqs[2].Arrival != 500*time.Millisecond {
		t.Fatalf("rate scale 4: %v %+v", err, reqs)
	}
	for _, rs := range []float64{-1, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, err := (Mooncake{RateScale: rs}).Read(strings.NewReader(trace)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "rate scale") {
			t.Errorf("rate scale %v: %v", rs, err)
		}
	}
}

// TestMooncakeArrivalOverflow: a valid timestamp divided by a tiny rate
// scale must not wrap around time.Duration.
func TestMooncakeArrivalOverflow(t *testing.T) {
	line := `{"timestamp": 1e12, "input_length": 10, "output_length": 1, "hash_ids": [1]}`
	if _, err := (Mooncake{RateScale: 1e-3}).Read(strings.NewReader(line)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "overflows") {
		t.Fatalf("1e12 ms at scale 1e-3 (1e24 ns): %v", err)
	}
	reqs, err := Mooncake{RateScale: 1}.Read(strings.NewReader(line))
	if err != nil || reqs[0].Arrival != time.Duration(1e12)*time.Millisecond {
		t.Fatalf("1e12 ms: %v %+v", err, reqs)
	}
}

func TestMooncakeLimit(t *testing.T) {
	reqs, err := Mooncake{Limit: 2}.Read(strings.NewReader(trace))
	if err != nil || len(reqs) != 2 {
		t.Fatalf("limit 2: %v, %d requests", err, len(reqs))
	}
	if _, err := (Mooncake{Limit: -1}).Read(strings.NewReader(trace)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("limit -1: %v", err)
	}
}
