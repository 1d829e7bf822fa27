package workload

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"
)

// Azure reads an Azure LLM inference trace (AzurePublicDataset, 2023 and
// 2024: CSV with a header of TIMESTAMP, ContextTokens, GeneratedTokens;
// timestamps like "2023-11-16 18:15:46.6805900" (2023) or
// "2024-05-10 00:00:00.009930+00:00" (2024), or RFC 3339) and gives its prompts
// synthetic prefixes, since the trace records lengths only: a share Share
// of the requests starts with one of Groups shared prefixes (Zipf
// popularity with exponent ZipfS; prefix g is PrefixMin..PrefixMax
// tokens, drawn once per prefix, cut to the request's length), and the
// rest of every prompt is its own. Arrival times and lengths are the
// trace's.
type Azure struct {
	// RateScale divides arrival times (0: 1; negative, NaN, Inf: error).
	RateScale float64
	// Limit keeps the first Limit requests (0: all; negative: error).
	Limit int
	// Groups shared prefixes (default 32), PrefixMin..PrefixMax tokens
	// long (defaults 256 and 2,048), Share of requests carrying one
	// (default 0.8; set Share < 0 for none), ZipfS their popularity
	// (> 1, default 1.1).
	Groups               int
	PrefixMin, PrefixMax int
	Share                float64
	ZipfS                float64
	// Seed fixes the prefixes and the token ids.
	Seed uint64
}

// azureLayouts are the timestamp forms: the 2023 traces' (no zone: UTC),
// the 2024 traces' (with a zone), RFC 3339.
var azureLayouts = []string{"2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00", time.RFC3339Nano}

func parseAzureTime(s string) (t time.Time, err error) {
	for _, l := range azureLayouts {
		if t, err = time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	return t, fmt.Errorf("%q is none of %q", s, azureLayouts)
}

// ReadFile reads a trace file.
func (c Azure) ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	return c.Read(f)
}

func (c *Azure) defaults() error {
	def(&c.Groups, 32)
	def(&c.PrefixMin, 256)
	def(&c.PrefixMax, 2048)
	deff(&c.Share, 0.8)
	deff(&c.ZipfS, 1.1)
	if c.Groups < 0 || c.PrefixMin < 1 || c.PrefixMax < c.PrefixMin || c.Share > 1 || !(c.ZipfS > 1) || math.IsNaN(c.Share) {
		return fmt.Errorf("%w: azure groups %d, prefix %d..%d, share %v, zipf %v", ErrBadWorkload, c.Groups, c.PrefixMin, c.PrefixMax, c.Share, c.ZipfS)
	}
	return nil
}

// Read parses a trace. Every malformed row is an error naming the line.
func (c Azure) Read(r io.Reader) ([]Request, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	if c.Limit < 0 {
		return nil, fmt.Errorf("%w: limit %d is negative", ErrBadWorkload, c.Limit)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xa2)) // #nosec G404 -- a benchmark's seeded stream
	plen := make([]int, c.Groups)
	for i := range plen {
		plen[i] = c.PrefixMin + rng.IntN(c.PrefixMax-c.PrefixMin+1)
	}
	zipf := rand.NewZipf(rng, c.ZipfS, 1, uint64(max(c.Groups-1, 0)))
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	var reqs []Request
	var t0 time.Time
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: azure trace line %d: %w", ErrBadWorkload, line, err)
		}
		if line == 1 && strings.EqualFold(strings.TrimSpace(rec[0]), "timestamp") {
			continue
		}
		ts, err := parseAzureTime(strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("%w: azure trace line %d: timestamp: %w", ErrBadWorkload, line, err)
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		out, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err := errors.Join(err1, err2); err != nil || in <= 0 || out < 0 || in > 1<<24 {
			return nil, fmt.Errorf("%w: azure trace line %d: context %q, generated %q", ErrBadWorkload, line, rec[1], rec[2])
		}
		if len(reqs) == 0 {
			t0 = ts
		}
		at := ts.Sub(t0)
		if at == math.MaxInt64 {
			return nil, fmt.Errorf("%w: azure trace line %d: timestamps span more than time.Duration holds", ErrBadWorkload, line)
		}
		if at < 0 || (len(reqs) > 0 && at < reqs[len(reqs)-1].Arrival) {
			return nil, fmt.Errorf("%w: azure trace line %d: timestamps go backwards", ErrBadWorkload, line)
		}
		id := uint64(len(reqs))
		segs := make([]segment, 0, 2)
		g := -1
		if c.Groups > 0 && rng.Float64() < c.Share {
			g = int(zipf.Uint64())
			segs = append(segs, seg(streamSystem, uint64(g), min(plen[g], in)))
		}
		if rest := in - segTokens(segs); rest > 0 {
			segs = append(segs, seg(streamUnique, id, rest))
		}
		reqs = append(reqs, Request{Arrival: at, PromptTokens: in, OutputTokens: max(out, 1), Group: g,
			Session: "a" + strconv.FormatUint(id, 10), src: &segSource{seed: c.Seed, segs: segs}})
		if c.Limit > 0 && len(reqs) == c.Limit {
			break
		}
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: the azure trace has no requests", ErrBadWorkload)
	}
	return finish(reqs, c.RateScale, 0)
}
