// Package loadgen is kvmesh's load generator: it sends a workload (loadtest/workload:
// shared-prefix groups, Mooncake traces) to any OpenAI-compatible endpoint, open-loop
// at the requests' arrival times and capped at a concurrency, streams every response
// through internal/openai's lenient SSE reader (strict with Config.StrictSSE) and
// measures, at the client, TTFT, E2E latency, throughput, tokens, cached tokens
// (from usage) and errors by kind.
//
// It owns the client side only: it never starts servers, and it reports in the same
// units and definitions as the discrete-event benchmark (loadtest/des) so both can be
// compared line for line.
package loadgen

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// Progress is a snapshot of a run, given to Config.Progress.
type Progress struct {
	Total, Sent, Completed, Failed int
	InFlight                       int
	Elapsed                        time.Duration
	PromptTokens, CachedTokens     int64
	OutputTokens                   int64
	Final                          bool
}

// generator is one run's state.
type generator struct {
	cfg    Config
	urls   []string // endpoint URLs; request i uses urls[i mod len]
	client *http.Client

	sent, completed, failed atomic.Int64
	slotWaits               atomic.Int64 // arrivals that found every concurrency slot taken
	prompt, cached, outToks atomic.Int64
	bodyPool                sync.Pool // *[]byte request bodies
	scratchPool             sync.Pool // *[]uint32 prompt token buffers
	start                   time.Time
}

// Run sends reqs and returns the report. It returns early, with what was measured so
// far, when ctx is cancelled; in-flight requests are cancelled then. Every goroutine it
// starts has ended when it returns.
func Run(ctx context.Context, cfg Config, reqs []workload.Request) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	g := &generator{cfg: cfg}
	for _, u := range cfg.targets() {
		g.urls = append(g.urls, endpointURL(u, cfg.Endpoint))
	}
	transport := &http.Transport{
		MaxIdleConns:        cfg.Concurrency,
		MaxIdleConnsPerHost: cfg.Concurrency,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer transport.CloseIdleConnections()
	g.client = &http.Client{Transport: transport}
	arrivals, err := schedule(cfg, reqs)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	first, next, err := workload.FollowUps(reqs)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	results := make([]Result, len(reqs))
	sent := make([]bool, len(reqs)) // each written by its request's goroutine, read after wg.Wait

	g.start = time.Now()
	stopProgress := g.startProgress(len(reqs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, cfg.Concurrency)
	// send runs request i, holding a concurrency slot, then its
	// follow-ups (workload.Request.After), each Think after i's answer in
	// a goroutine of its own.
	var send func(i int, at time.Duration)
	send = func(i int, at time.Duration) {
		sent[i] = true
		g.one(ctx, g.urls[i%len(g.urls)], &reqs[i], at, &results[i])
		<-sem
		for j := firstOf(first, i); j >= 0; j = next[j] {
			wg.Add(1)
			go func(j int) {
				defer wg.Done()
				at := time.Since(g.start) + reqs[j].Think
				t := time.NewTimer(reqs[j].Think)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return
				}
				if !g.acquire(ctx, sem) {
					return
				}
				send(j, at)
			}(j)
		}
	}
	timer := time.NewTimer(0)
	<-timer.C
dispatch:
	for i := range reqs {
		if reqs[i].After > 0 {
			continue // sent by its predecessor's goroutine
		}
		if wait := time.Until(g.start.Add(arrivals[i])); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				break dispatch
			}
		}
		if !g.acquire(ctx, sem) {
			break dispatch
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			send(i, arrivals[i])
		}(i)
	}
	wg.Wait()
	stopProgress()
	done := results[:0:0]
	for i, ok := range sent {
		if ok {
			done = append(done, results[i])
		}
	}
	rep := buildReport(done, len(reqs))
	rep.OpenLoop = len(arrivals) > 0 && arrivals[len(arrivals)-1] > 0
	rep.SlotWaits = int(g.slotWaits.Load())
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("loadgen: stopped after %d of %d requests: %w", len(done), len(reqs), err)
	}
	return rep, nil
}

// acquire takes a concurrency slot, counting an arrival that had to wait
// for one; false when ctx ended first.
func (g *generator) acquire(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	default:
	}
	g.slotWaits.Add(1)
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// firstOf is i's first follow-up (-1: none; first is nil when no request
// has one).
func firstOf(first []int, i int) int {
	if first == nil {
		return -1
	}
	return first[i]
}

// one sends request r and records it in res.
func (g *generator) one(ctx context.Context, url string, r *workload.Request, arrival time.Duration, res *Result) {
	bp, _ := g.bodyPool.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	sp, _ := g.scratchPool.Get().(*[]uint32)
	if sp == nil {
		sp = new([]uint32)
	}
	*bp, *sp = appendBody((*bp)[:0], &g.cfg, r, *sp)
	g.scratchPool.Put(sp)

	*res = Result{ID: r.ID, Group: r.Group, Session: r.Session, Sequences: max(1, g.cfg.N)}
	res.Sent = time.Since(g.start)
	res.SendLag = max(res.Sent-arrival, 0)
	g.sent.Add(1)
	g.do(ctx, url, *bp, r, res)
	g.bodyPool.Put(bp)
	if res.ErrKind != "" {
		g.failed.Add(1)
		return
	}
	g.completed.Add(1)
	g.prompt.Add(int64(res.PromptTokens))
	g.cached.Add(int64(res.CachedTokens))
	g.outToks.Add(int64(res.OutputTokens))
}

// startProgress runs the progress callback until the returned stop is called; stop
// makes one last, final call.
func (g *generator) startProgress(total int) (stop func()) {
	if g.cfg.Progress == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(g.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				g.cfg.Progress(g.snapshot(total, true))
				return
			case <-t.C:
				g.cfg.Progress(g.snapshot(total, false))
			}
		}
	}()
	return func() { close(quit); <-done }
}

func (g *generator) snapshot(total int, final bool) Progress {
	p := Progress{
		Total: total, Sent: int(g.sent.Load()), Completed: int(g.completed.Load()), Failed: int(g.failed.Load()),
		Elapsed: time.Since(g.start), PromptTokens: g.prompt.Load(), CachedTokens: g.cached.Load(),
		OutputTokens: g.outToks.Load(), Final: final,
	}
	p.InFlight = p.Sent - p.Completed - p.Failed
	return p
}

// maxArrivalS is the latest arrival a time.Duration holds, in seconds
// (about 292 years).
const maxArrivalS = float64(math.MaxInt64) / float64(time.Second)

// schedule returns each request's send offset. A Rate so low that an
// arrival is past what a time.Duration holds is an error (converted, it
// would wrap to a negative offset: every request sent at once).
func schedule(cfg Config, reqs []workload.Request) ([]time.Duration, error) {
	out := make([]time.Duration, len(reqs))
	switch {
	case cfg.Rate < 0:
		// closed loop: all at 0
	case cfg.Rate > 0:
		rng := rand.New(rand.NewPCG(cfg.Seed, 0x6c6f6164))
		t := 0.0
		for i := range out {
			t += rng.ExpFloat64() / cfg.Rate
			if !(t < maxArrivalS) {
				return nil, fmt.Errorf("%w: rate %g req/s: request %d would arrive %.3g s (%.3g years) after the start, past the %.0f years an arrival time can be (a unit mistake?)",
					ErrConfig, cfg.Rate, i+1, t, t/(365.25*86400), maxArrivalS/(365.25*86400))
			}
			out[i] = time.Duration(t * float64(time.Second))
		}
	default:
		for i := range reqs {
			out[i] = max(reqs[i].Arrival, 0)
		}
		// Workload arrivals are sorted; keep dispatch order monotonic anyway.
		for i := 1; i < len(out); i++ {
			out[i] = max(out[i], out[i-1])
		}
	}
	return out, nil
}

// endpointURL joins the base URL and the endpoint path, accepting a base with or
// without a trailing /v1.
func endpointURL(base string, ep Endpoint) string {
	base = strings.TrimRight(base, "/")
	base = strings.TrimSuffix(base, "/v1")
	switch ep {
	case Chat:
		return base + "/v1/chat/completions"
	case Responses:
		return base + "/v1/responses"
	case Messages:
		return base + "/v1/messages"
	}
	return base + "/v1/completions"
}
