package report

import (
	"io"
	"math"
	"os"
)

// Run is one policy's finished requests.
type Run struct {
	Records []Record
	// EngineIDs names the engines Record.Engine indexes.
	EngineIDs []string
	// Prefill, when not nil, is parallel to Records: the engine (as
	// Record.Engine indexes) that ran each request's prefill leg, -1 when
	// Record.Engine prefilled it (a P/D run's aggregated requests).
	Prefill []int
	// Failures are the run's failed requests (the CSV's rows with an
	// error; the plots and the table's latencies leave them out).
	Failures []Failure
}

// Failure is one failed request. Start is as Record's; E2E is the time
// from it to the failure (0 when the request was refused on arrival:
// the DES's too-long prompts); Engine indexes Run.EngineIDs (-1:
// unknown); Kind is the error's kind (PolicyResult.Errors').
type Failure struct {
	Start, E2E float64
	Engine     int
	Kind       string
}

// Record is one finished request, the raw material of the HTML report's
// time series and distributions. Times are engine seconds from the run's
// start (the live benchmark converts its wall clock back to engine time).
type Record struct {
	// Start is when the request reached the system: its arrival (DES) or
	// when the client sent it (live, loadtest).
	Start float64
	// TTFT and E2E are measured from Start.
	TTFT, E2E                                float64
	PromptTokens, CachedTokens, OutputTokens int
	// Sequences is the answers OutputTokens is spread over (the request's
	// n: they decode side by side); 0 or 1: one.
	Sequences int
	// Engine indexes Run.EngineIDs (-1: unknown).
	Engine int
}

// TPOT is the mean time per output token of one sequence after its first
// (0 for a request of one token per sequence).
func (r Record) TPOT() float64 {
	out := r.OutputTokens / max(1, r.Sequences)
	if out < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / float64(out-1)
}

// Series is a run's records binned over time, as the HTML report plots them.
type Series struct {
	// BinWidth is each bin's length in seconds; bin i covers
	// [i·BinWidth, (i+1)·BinWidth).
	BinWidth float64
	// Throughput is requests completed per second in each bin.
	Throughput []float64
	// Waiting is the mean number of requests waiting for their first token
	// (queued or in prefill) over each bin.
	Waiting []float64
	// HitRate is Σ cached / Σ prompt tokens of the requests started in each
	// bin (NaN when none started).
	HitRate []float64
}

// Bin computes recs' series over [0, end) in n bins.
func Bin(recs []Record, end float64, n int) Series {
	if n < 1 || !(end > 0) {
		return Series{}
	}
	s := Series{BinWidth: end / float64(n), Throughput: make([]float64, n), Waiting: make([]float64, n), HitRate: make([]float64, n)}
	cached, prompt := make([]float64, n), make([]float64, n)
	bin := func(t float64) int { return min(max(int(t/s.BinWidth), 0), n-1) }
	for _, r := range recs {
		s.Throughput[bin(r.Start+r.E2E)]++
		b := bin(r.Start)
		cached[b] += float64(r.CachedTokens)
		prompt[b] += float64(r.PromptTokens)
	}
	// Waiting: each request adds the part of [Start, Start+TTFT) inside a
	// bin, over the bin's width (a time average, not a sample).
	for _, r := range recs {
		a, b := r.Start, r.Start+r.TTFT
		for i := bin(a); i <= bin(b); i++ {
			lo, hi := float64(i)*s.BinWidth, float64(i+1)*s.BinWidth
			if ov := min(b, hi) - max(a, lo); ov > 0 {
				s.Waiting[i] += ov / s.BinWidth
			}
		}
	}
	for i := range n {
		s.Throughput[i] /= s.BinWidth
		s.HitRate[i] = math.NaN()
		if prompt[i] > 0 {
			s.HitRate[i] = cached[i] / prompt[i]
		}
	}
	return s
}

// PerEngine counts recs per engine among n engines (unknown engines are
// not counted).
func PerEngine(recs []Record, n int) []int {
	out := make([]int, n)
	for _, r := range recs {
		if r.Engine >= 0 && r.Engine < n {
			out[r.Engine]++
		}
	}
	return out
}

// End is the latest finish among recs (seconds from the run's start).
func End(recs []Record) float64 {
	end := 0.0
	for _, r := range recs {
		end = max(end, r.Start+r.E2E)
	}
	return end
}

// WriteFile creates the file at path and writes it with write (WriteHTML,
// WriteCSV), closing it; the first error is returned.
func WriteFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
