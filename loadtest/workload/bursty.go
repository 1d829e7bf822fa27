package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Bursty is a steady BaseRate with bursts: episodes start after
// exponential gaps (mean BurstGap), last an exponential time (mean
// BurstLength, at least 30 s) and multiply the rate by BurstFactor; the
// same noise as Diurnal applies. Arrivals are Poisson within each piece.
// Deterministic by Seed.
type Bursty struct {
	Duration    time.Duration // default 60m
	BaseRate    float64       // requests/s; default 2
	BurstFactor float64       // default 3
	BurstGap    time.Duration // default 10m
	BurstLength time.Duration // default 3m
	Noise       float64       // default 0.1 (negative: none)
	NoisePeriod time.Duration // default 2m
	Mix         LongPromptMix
	Seed        uint64
}

// Defaults fills unset fields.
func (b *Bursty) Defaults() {
	if b.Duration == 0 {
		b.Duration = 60 * time.Minute
	}
	if b.BaseRate == 0 {
		b.BaseRate = 2
	}
	if b.BurstFactor == 0 {
		b.BurstFactor = 3
	}
	if b.BurstGap == 0 {
		b.BurstGap = 10 * time.Minute
	}
	if b.BurstLength == 0 {
		b.BurstLength = 3 * time.Minute
	}
	if b.Noise == 0 {
		b.Noise = 0.1
	}
	if b.NoisePeriod == 0 {
		b.NoisePeriod = 2 * time.Minute
	}
	if b.Seed == 0 {
		b.Seed = 1
	}
	b.Mix.Defaults()
}

// Validate lists every problem (after Defaults).
func (b Bursty) Validate() error {
	errs := []error{b.Mix.Validate()}
	if b.Duration <= 0 || b.BurstGap <= 0 || b.BurstLength <= 0 || b.NoisePeriod <= 0 {
		errs = append(errs, fmt.Errorf("%w: bursty: durations must be > 0", ErrBadWorkload))
	}
	if !(b.BaseRate > 0) || !(b.BurstFactor >= 1) || math.IsInf(b.BaseRate*b.BurstFactor, 0) {
		errs = append(errs, fmt.Errorf("%w: bursty: want base rate > 0 and burst factor ≥ 1, finite", ErrBadWorkload))
	}
	return errors.Join(errs...)
}

// Bursts returns the burst episodes as [start, end) pairs.
func (b Bursty) Bursts() [][2]time.Duration {
	b.Defaults()
	rng := rand.New(rand.NewPCG(b.Seed, 0xb5))
	var out [][2]time.Duration
	t := time.Duration(0)
	for {
		t += time.Duration(rng.ExpFloat64() * float64(b.BurstGap))
		l := max(time.Duration(rng.ExpFloat64()*float64(b.BurstLength)), 30*time.Second)
		if t >= b.Duration {
			return out
		}
		out = append(out, [2]time.Duration{t, min(t+l, b.Duration)})
		t += l
	}
}

// Generate returns the requests in arrival order.
func (b Bursty) Generate() ([]Request, error) {
	b.Defaults()
	if err := b.Validate(); err != nil {
		return nil, err
	}
	bursts := b.Bursts()
	rng := rand.New(rand.NewPCG(b.Seed, 0xb0))
	nz := newNoise(rng, b.Noise, b.NoisePeriod, b.Duration)
	rate := func(t time.Duration) float64 {
		r := b.BaseRate * nz.at(t)
		for _, e := range bursts {
			if t >= e[0] && t < e[1] {
				return r * b.BurstFactor
			}
		}
		return r
	}
	return thin(rng, b.Duration, b.BaseRate*b.BurstFactor*nz.max(), rate, newMixSampler(b.Mix, b.Seed)), nil
}
