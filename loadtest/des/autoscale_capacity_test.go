package des

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
)

var testCapacities = []CapacitySplit{{2, 2, 6.48}, {1, 1, 2.67}, {2, 1, 5.39}, {3, 2, 9.52}, {3, 3, 10.5}, {4, 2, 11.11}}

// TestCapacityScalerReactive: the cheapest split (fewest engines, then the
// highest capacity) serving (1 + headroom) × the window's arrival rate;
// above the table, the split with the highest capacity.
func TestCapacityScalerReactive(t *testing.T) {
	for _, c := range []struct {
		rate, h float64
		p, d    int
	}{
		{0, 0, 1, 1},
		{2.67, 0, 1, 1},
		{2.68, 0, 2, 1},
		{2.5, 0.1, 2, 1}, // 2.75 > 2.67
		{6, 0, 2, 2},
		{6, 0.1, 3, 2},
		{10, 0, 4, 2}, // 3/3 and 4/2 both 6 engines: 4/2 serves more
		{11.2, 0, 4, 2},
		{6, -0.2, 2, 1}, // 4.8 ≤ 5.39: below the table's rate (riding queues)
	} {
		s, err := NewCapacityScaler(testCapacities, c.h, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p, d := s.Decide(time.Minute, &Signals{ArrivalRate: c.rate}); p != c.p || d != c.d {
			t.Errorf("rate %v headroom %v: %d/%d, want %d/%d", c.rate, c.h, p, d, c.p, c.d)
		}
		if s.Name() != "capacity-reactive" || !strings.Contains(s.Setting(), "1/1 2.67") {
			t.Errorf("name %q setting %q", s.Name(), s.Setting())
		}
	}
}

// TestCapacityScalerClairvoyant: during minute k the larger of minute k's
// and minute k+1's splits, from the trace's arrivals (the window's rate is
// not read).
func TestCapacityScalerClairvoyant(t *testing.T) {
	// Minute 0: 60 arrivals (1 req/s); minute 1: 300 (5 req/s); minute 2: 120 (2 req/s).
	var reqs []workload.Request
	for m, n := range []int{60, 300, 120} {
		for i := range n {
			reqs = append(reqs, workload.Request{Arrival: time.Duration(m)*time.Minute + time.Duration(i)*time.Minute/time.Duration(n)})
		}
	}
	s, err := NewCapacityScaler(testCapacities, 0, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		at   time.Duration
		p, d int
	}{
		{0, 2, 1},                // 1 req/s now, 5 next: 2/1 ready when minute 1 starts
		{45 * time.Second, 2, 1}, // same minute
		{time.Minute, 2, 1},      // 5 now, 2 next
		{2 * time.Minute, 1, 1},  // 2 now, none next
		{10 * time.Minute, 1, 1}, // past the trace
	} {
		if p, d := s.Decide(c.at, &Signals{ArrivalRate: 100}); p != c.p || d != c.d {
			t.Errorf("at %v: %d/%d, want %d/%d", c.at, p, d, c.p, c.d)
		}
	}
	if s.Name() != "capacity-clairvoyant" {
		t.Errorf("name %q", s.Name())
	}
}

func TestParseCapacityTable(t *testing.T) {
	got, err := ParseCapacityTable("1/1=2.67, 2/1=5.39")
	if err != nil || len(got) != 2 || got[1] != (CapacitySplit{2, 1, 5.39}) {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range []string{"", "1/1", "1=2", "0/1=2", "1/0=2", "1/1=0", "1/1=-1", "1/1=NaN", "1/1=Inf", "a/1=2"} {
		if _, err := ParseCapacityTable(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	for _, h := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := NewCapacityScaler(got, h, nil); err == nil {
			t.Errorf("headroom %v: accepted", h)
		}
	}
	if _, err := NewCapacityScaler(nil, 0, nil); err == nil {
		t.Error("no table: accepted")
	}
}
