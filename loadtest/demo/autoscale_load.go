package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// rampGen sends the ramp's requests open-loop (Poisson arrivals at the
// rate of the moment) to the ingress and keeps the results of the current
// view window and the totals.
type rampGen struct {
	cfg    AutoscaleConfig
	url    string
	client *http.Client
	rng    *rand.Rand // run's goroutine only

	mu                   sync.Mutex // guards the fields below
	cur                  window
	sent, ok, failed, in int
	attained             float64 // requests within both targets
	lastErr              string
}

type reqResult struct{ ttft, tpot time.Duration }

type window struct {
	ok     []reqResult
	failed int
}

// maxInFlight bounds the requests open at once; an arrival beyond it is
// counted as failed (the deployment is far behind) rather than queued.
const maxInFlight = 512

func newRampGen(cfg AutoscaleConfig, ingress string) *rampGen {
	tr := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	return &rampGen{cfg: cfg, url: ingress + "/v1/completions", client: &http.Client{Transport: tr, Timeout: time.Minute},
		rng: rand.New(rand.NewPCG(1, 0x72616d70))}
}

// run sends until ctx ends, then waits for the requests in flight (they
// are not cancelled with ctx: bounded by the client timeout, they finish,
// so a stopped run still measures what it sent; deferred calls run last
// first, so the wait comes before the cancel).
func (g *rampGen) run(ctx context.Context, start time.Time) {
	reqCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer g.client.CloseIdleConnections()
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for id := 0; ; id++ {
		_, rate := g.cfg.rateAt(time.Since(start))
		wait := time.Duration(g.rng.ExpFloat64() / math.Max(rate, 0.05) * float64(time.Second))
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		g.mu.Lock()
		g.sent++
		full := g.in >= maxInFlight
		if full {
			g.failed++
			g.cur.failed++
			g.lastErr = "more than 512 requests in flight: arrival dropped"
		} else {
			g.in++
		}
		g.mu.Unlock()
		if full {
			continue
		}
		body := g.body(id)
		wg.Go(func() {
			r, err := g.one(reqCtx, body)
			g.mu.Lock()
			defer g.mu.Unlock()
			g.in--
			if err != nil {
				g.failed++
				g.cur.failed++
				g.lastErr = err.Error()
				return
			}
			g.ok++
			g.cur.ok = append(g.cur.ok, r)
			if r.ttft <= g.cfg.TTFT && r.tpot <= g.cfg.TPOT {
				g.attained++
			}
		})
	}
}

// body is a distinct prompt per request: no prefix hits, every request
// needs its full prefill.
func (g *rampGen) body(id int) []byte {
	b := make([]byte, 0, 16+7*g.cfg.PromptTokens)
	b = append(b, `{"model":"kvmesh-sim","stream":true,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(g.cfg.OutputTokens), 10)
	b = append(b, `,"prompt":[`...)
	for i := range g.cfg.PromptTokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(1000+(id*7919+i*31)%30000), 10)
	}
	return append(b, "]}"...)
}

// one sends a streaming completion and measures TTFT (first text chunk)
// and TPOT (the rest over the remaining chunks).
func (g *rampGen) one(ctx context.Context, body []byte) (reqResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	if err != nil {
		return reqResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := g.client.Do(req)
	if err != nil {
		return reqResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return reqResult{}, &httpError{resp.StatusCode}
	}
	var first time.Time
	chunks := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Contains(line, []byte("[DONE]")) || !bytes.Contains(line, []byte(`"text"`)) {
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		chunks++
	}
	if err := sc.Err(); err != nil {
		return reqResult{}, err
	}
	if chunks == 0 {
		return reqResult{}, errNoTokens
	}
	r := reqResult{ttft: first.Sub(t0)}
	if chunks > 1 {
		r.tpot = time.Since(first) / time.Duration(chunks-1)
	}
	return r, nil
}

type httpError struct{ status int }

func (e *httpError) Error() string { return "http " + strconv.Itoa(e.status) }

var errNoTokens = jsonError("stream without tokens")

type jsonError string

func (e jsonError) Error() string { return string(e) }

func (g *rampGen) lastError() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr
}

// window returns the results since the last call and starts a new window.
func (g *rampGen) window() window {
	g.mu.Lock()
	defer g.mu.Unlock()
	w := g.cur
	g.cur = window{}
	return w
}

// totals: sent, ok, failed and the attainment over the whole run so far.
func (g *rampGen) totals() (sent, ok, failed int, attainment float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sent, g.ok, g.failed, g.attained / math.Max(float64(g.ok+g.failed), 1)
}

// attainment is the share of the window's requests within both targets
// (failures miss); NaN for an empty window.
func (w window) attainment(c AutoscaleConfig) float64 {
	n := len(w.ok) + w.failed
	if n == 0 {
		return math.NaN()
	}
	in := 0
	for _, r := range w.ok {
		if r.ttft <= c.TTFT && r.tpot <= c.TPOT {
			in++
		}
	}
	return float64(in) / float64(n)
}

// ingressReady reports whether the ingress's /ready counts n engines.
func ingressReady(base string, n int) bool {
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(base + "/ready")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var r struct {
		Ready   bool `json:"ready"`
		Engines int  `json:"engines"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&r) == nil && r.Ready && r.Engines >= n
}
