package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// LongPromptMix is the prompt/output mix of a long-prompt P/D workload (RAG
// or document chat): each request starts with one of Prefixes shared
// documents or system prompts of PrefixTokens tokens (popularity Zipf-like,
// s = 1), followed by its own tokens (log-normal, mean OwnTokens) and asks
// for a log-normal number of output tokens (mean OutputTokens).
type LongPromptMix struct {
	Prefixes     int // default 64
	PrefixTokens int // default 1024
	OwnTokens    int // mean; default 2048
	OutputTokens int // mean; default 192
	// MaxPrompt caps own tokens (default 8 × OwnTokens); MaxOutput caps
	// output tokens (default 4 × OutputTokens).
	MaxPrompt, MaxOutput int
}

// Defaults fills unset fields.
func (m *LongPromptMix) Defaults() {
	if m.Prefixes == 0 {
		m.Prefixes = 64
	}
	if m.PrefixTokens == 0 {
		m.PrefixTokens = 1024
	}
	if m.OwnTokens == 0 {
		m.OwnTokens = 2048
	}
	if m.OutputTokens == 0 {
		m.OutputTokens = 192
	}
	if m.MaxPrompt == 0 {
		m.MaxPrompt = 8 * m.OwnTokens
	}
	if m.MaxOutput == 0 {
		m.MaxOutput = 4 * m.OutputTokens
	}
}

// Validate lists every problem.
func (m LongPromptMix) Validate() error {
	var errs []error
	if m.Prefixes <= 0 || m.PrefixTokens < 0 || m.OwnTokens <= 0 || m.OutputTokens <= 0 {
		errs = append(errs, fmt.Errorf("%w: mix: prefixes %d and own/output tokens %d/%d must be > 0, prefix tokens %d ≥ 0",
			ErrBadWorkload, m.Prefixes, m.OwnTokens, m.OutputTokens, m.PrefixTokens))
	}
	if m.MaxPrompt < m.OwnTokens || m.MaxOutput < m.OutputTokens {
		errs = append(errs, fmt.Errorf("%w: mix: caps %d/%d below the means", ErrBadWorkload, m.MaxPrompt, m.MaxOutput))
	}
	return errors.Join(errs...)
}

// mixSampler draws requests of a LongPromptMix.
type mixSampler struct {
	m    LongPromptMix
	cdf  []float64 // prefix popularity
	src  *mixSource
	seed uint64
}

func newMixSampler(m LongPromptMix, seed uint64) *mixSampler {
	s := &mixSampler{m: m, cdf: make([]float64, m.Prefixes), src: &mixSource{seed: seed, prefix: m.PrefixTokens}, seed: seed}
	sum := 0.0
	for i := range s.cdf {
		sum += 1 / float64(i+1)
		s.cdf[i] = sum
	}
	for i := range s.cdf {
		s.cdf[i] /= sum
	}
	return s
}

// logNormal draws a log-normal value with the given mean and σ = 0.6.
func logNormal(rng *rand.Rand, mean float64) float64 {
	const sigma = 0.6
	return mean * math.Exp(sigma*rng.NormFloat64()-sigma*sigma/2)
}

func (s *mixSampler) request(rng *rand.Rand, id int, at float64) Request {
	u := rng.Float64()
	g := 0
	for g < len(s.cdf)-1 && s.cdf[g] < u {
		g++
	}
	own := min(max(int(logNormal(rng, float64(s.m.OwnTokens))), 16), s.m.MaxPrompt)
	out := min(max(int(logNormal(rng, float64(s.m.OutputTokens))), 2), s.m.MaxOutput)
	r := Request{ID: id, Arrival: time.Duration(at * float64(time.Second)), PromptTokens: s.m.PrefixTokens + own,
		OutputTokens: out, Group: g, Session: "d" + strconv.Itoa(g) + "-" + strconv.Itoa(id), src: s.src}
	r.qid = uint64(id)
	return r
}

type mixSource struct {
	seed   uint64
	prefix int
}

func (s *mixSource) appendPrompt(dst []uint32, r *Request) []uint32 {
	for i := 0; i < s.prefix; i++ {
		dst = append(dst, token(s.seed, uint64(r.Group)<<1, i))
	}
	for i := s.prefix; i < r.PromptTokens; i++ {
		dst = append(dst, token(s.seed, r.qid<<1|1, i))
	}
	return dst
}

// Diurnal is a day's traffic compressed into Duration of virtual time: the
// rate follows a cosine from TroughRate (at the start and end of the day)
// to PeakRate (at PeakAt × Duration), multiplied by a slowly varying noise
// (a new N(1, Noise) factor every NoisePeriod, linearly interpolated) and,
// within the burst, by BurstFactor. Arrivals are a non-homogeneous Poisson
// process (thinning). Deterministic by Seed.
type Diurnal struct {
	Duration             time.Duration // default 90m
	PeakRate, TroughRate float64       // requests/s; defaults 6 and 1
	PeakAt               float64       // fraction of the day; default 0.55
	Noise                float64       // relative; default 0.1 (negative: none)
	NoisePeriod          time.Duration // default 2m
	// BurstAt (fraction of the day), BurstLength and BurstFactor add one
	// burst; defaults 0.3, 3m, 2 (BurstFactor < 0: none).
	BurstAt     float64
	BurstLength time.Duration
	BurstFactor float64
	Mix         LongPromptMix
	Seed        uint64
}

// Defaults fills unset fields.
func (d *Diurnal) Defaults() {
	if d.Duration == 0 {
		d.Duration = 90 * time.Minute
	}
	if d.PeakRate == 0 {
		d.PeakRate = 6
	}
	if d.TroughRate == 0 {
		d.TroughRate = 1
	}
	if d.PeakAt == 0 {
		d.PeakAt = 0.55
	}
	if d.Noise == 0 {
		d.Noise = 0.1
	}
	if d.NoisePeriod == 0 {
		d.NoisePeriod = 2 * time.Minute
	}
	if d.BurstAt == 0 {
		d.BurstAt = 0.3
	}
	if d.BurstLength == 0 {
		d.BurstLength = 3 * time.Minute
	}
	if d.BurstFactor == 0 {
		d.BurstFactor = 2
	}
	if d.Seed == 0 {
		d.Seed = 1
	}
	d.Mix.Defaults()
}

// Validate lists every problem (after Defaults).
func (d Diurnal) Validate() error {
	errs := []error{d.Mix.Validate()}
	if d.Duration <= 0 || d.NoisePeriod <= 0 || d.BurstLength < 0 {
		errs = append(errs, fmt.Errorf("%w: diurnal: duration, noise period must be > 0, burst length ≥ 0", ErrBadWorkload))
	}
	if !(d.TroughRate > 0) || d.PeakRate < d.TroughRate || math.IsInf(d.PeakRate, 0) {
		errs = append(errs, fmt.Errorf("%w: diurnal: want 0 < trough %v ≤ peak %v, finite", ErrBadWorkload, d.TroughRate, d.PeakRate))
	}
	if d.PeakAt <= 0 || d.PeakAt >= 1 || d.BurstAt < 0 || d.BurstAt > 1 {
		errs = append(errs, fmt.Errorf("%w: diurnal: peak at %v and burst at %v must be fractions of the day", ErrBadWorkload, d.PeakAt, d.BurstAt))
	}
	return errors.Join(errs...)
}

// Rate is the arrival rate at t without noise (requests/s).
func (d Diurnal) Rate(t time.Duration) float64 {
	x := t.Seconds() / d.Duration.Seconds()
	// A cosine with its maximum at PeakAt and its minimum half a day away,
	// stretched so both ends of the day sit at the trough.
	var phase float64
	if x <= d.PeakAt {
		phase = math.Pi * (1 - x/d.PeakAt)
	} else {
		phase = math.Pi * (x - d.PeakAt) / (1 - d.PeakAt)
	}
	r := d.TroughRate + (d.PeakRate-d.TroughRate)*(1+math.Cos(phase))/2
	b := d.BurstAt * d.Duration.Seconds()
	if d.BurstFactor > 0 && t.Seconds() >= b && t.Seconds() < b+d.BurstLength.Seconds() {
		r *= d.BurstFactor
	}
	return r
}

// Generate returns the requests in arrival order.
func (d Diurnal) Generate() ([]Request, error) {
	d.Defaults()
	if err := d.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(d.Seed, 0xd1a))
	noise := newNoise(rng, d.Noise, d.NoisePeriod, d.Duration)
	rmax := d.PeakRate * max(d.BurstFactor, 1) * noise.max()
	return thin(rng, d.Duration, rmax, func(t time.Duration) float64 { return d.Rate(t) * noise.at(t) }, newMixSampler(d.Mix, d.Seed)), nil
}

// thin draws a non-homogeneous Poisson process of rate(t) ≤ rmax on
// [0, length) and a request of the mix at each arrival.
func thin(rng *rand.Rand, length time.Duration, rmax float64, rate func(time.Duration) float64, mix *mixSampler) []Request {
	var reqs []Request
	t := 0.0
	for {
		t += rng.ExpFloat64() / rmax
		at := time.Duration(t * float64(time.Second))
		if at >= length {
			return reqs
		}
		if rng.Float64()*rmax <= rate(at) {
			reqs = append(reqs, mix.request(rng, len(reqs), t))
		}
	}
}

// noise is a piecewise-linear multiplicative factor with knots every period.
type noise struct {
	knots  []float64
	period time.Duration
}

func newNoise(rng *rand.Rand, rel float64, period, length time.Duration) noise {
	n := noise{period: period, knots: make([]float64, int(length/period)+2)}
	for i := range n.knots {
		n.knots[i] = 1
		if rel > 0 {
			n.knots[i] = max(1+rel*rng.NormFloat64(), 0.2)
		}
	}
	return n
}

func (n noise) at(t time.Duration) float64 {
	i := int(t / n.period)
	if i+1 >= len(n.knots) {
		return n.knots[len(n.knots)-1]
	}
	f := float64(t%n.period) / float64(n.period)
	return n.knots[i]*(1-f) + n.knots[i+1]*f
}

func (n noise) max() float64 {
	m := 1.0
	for _, k := range n.knots {
		m = max(m, k)
	}
	return m
}
