package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvmesh/kvmesh/internal/backoff"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// Metric names of spec §5, in order of preference (vLLM, older vLLM, SGLang),
// plus the kvmesh simulator's queued-prefill gauge.
var (
	runningNames = []string{"vllm:num_requests_running", "sglang:num_running_reqs"}
	waitingNames = []string{"vllm:num_requests_waiting", "sglang:num_queue_reqs"}
	usageNames   = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"}
	prefillNames = []string{"vllm:num_queued_prefill_tokens", "kvmesh_sim_queued_prefill_tokens", "sglang:num_queued_prefill_tokens"}
	// The KV capacity: vLLM's is the num_gpu_blocks label of its cache
	// config info gauge (value 1), SGLang's a gauge in tokens.
	cacheInfoName   = "vllm:cache_config_info"
	kvCapacityNames = []string{"sglang:max_total_num_tokens"}
	// workNames are counters that grow while the engine serves requests,
	// each one family of names (its first present is read): Load.work sums
	// them, for the check that a working engine's KV events arrive (silent.go).
	workNames = [][]string{
		{"vllm:prompt_tokens_total", "sglang:prompt_tokens_total"},
		{"vllm:generation_tokens_total", "sglang:generation_tokens_total"},
		{"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"},
		{"vllm:request_success_total", "sglang:num_requests_total"},
	}
)

// errNoMetrics: the metrics URL answered 404 (an engine without metrics).
var errNoMetrics = errors.New("scrape: no metrics (404)")

// maxScrapeBytes bounds one /metrics body.
const maxScrapeBytes = 8 << 20

// parseLoad extracts the load from a Prometheus text exposition. Series of
// several DP ranks (label sets) are summed; KV usage is averaged over them.
func parseLoad(r io.Reader) (Load, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Load{}, fmt.Errorf("parse metrics: %w", err)
	}
	sum := func(names []string) (float64, int, bool) {
		for _, n := range names {
			f, ok := fams[n]
			if !ok {
				continue
			}
			v, k := 0.0, 0
			for _, m := range f.GetMetric() {
				switch {
				case m.GetGauge() != nil:
					v += m.GetGauge().GetValue()
				case m.GetCounter() != nil:
					v += m.GetCounter().GetValue()
				case m.GetUntyped() != nil:
					v += m.GetUntyped().GetValue()
				}
				k++
			}
			return v, k, true
		}
		return 0, 0, false
	}
	var l Load
	if v, _, ok := sum(runningNames); ok {
		l.Running = count(v)
	}
	if v, _, ok := sum(waitingNames); ok {
		l.Waiting = count(v)
	}
	if v, k, ok := sum(usageNames); ok && k > 0 && !math.IsNaN(v) {
		l.KVUsage = min(max(v/float64(k), 0), 1)
	}
	if v, _, ok := sum(prefillNames); ok {
		l.QueuedPrefill = int64(count(v))
	}
	l.GPUBlocks, l.badGPUBlocks = gpuBlocks(fams[cacheInfoName])
	if v, _, ok := sum(kvCapacityNames); ok {
		l.KVTokens = int64(count(v))
	}
	for _, names := range workNames {
		if v, _, ok := sum(names); ok && !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 {
			l.work += v
			l.workOK = true
		}
	}
	return l, nil
}

// MaxGPUBlocks bounds a reported KV capacity: a larger one is not believed.
const MaxGPUBlocks = 1 << 30

// gpuBlocks is the num_gpu_blocks label of vLLM's cache config info: the
// largest over its series (vLLM's front end labels one series per DP
// engine, each with the sum over the engines), 0 when absent. A value that
// is not an integer in 1..MaxGPUBlocks ("None" before the engine sized its
// cache, a broken exporter) is left out and returned as bad.
func gpuBlocks(f *dto.MetricFamily) (n int, bad string) {
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() != "num_gpu_blocks" {
				continue
			}
			v, err := strconv.Atoi(lp.GetValue())
			if err != nil || v <= 0 || v > MaxGPUBlocks {
				bad = lp.GetValue()
				continue
			}
			n = max(n, v)
		}
	}
	return n, bad
}

// capacity is the engine's KV capacity in blocks of blockSize tokens: vLLM's
// reported block count, else SGLang's token capacity over blockSize (0 when
// the block size is not known yet), else 0 (not reported).
func (l *Load) capacity(blockSize int) int {
	if l.GPUBlocks > 0 {
		return l.GPUBlocks
	}
	if l.KVTokens > 0 && blockSize > 0 {
		if n := l.KVTokens / int64(blockSize); n <= MaxGPUBlocks {
			return int(n)
		}
	}
	return 0
}

// count turns a scraped gauge into a sane count: NaN, negatives and absurd
// values (a broken exporter) become 0 rather than poisoning gossip.
func count(v float64) int {
	if math.IsNaN(v) || v < 0 || v > 1e12 {
		return 0
	}
	return int(v)
}

// scrapeLoop polls the engine's /metrics until ctx ends.
func (e *engine) scrapeLoop(ctx context.Context, client *http.Client, url string) {
	t := time.NewTicker(e.s.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		l, err := scrape(ctx, client, url)
		e.mu.Lock()
		if errors.Is(err, errNoMetrics) {
			// The engine's HTTP server is alive but serves no metrics (SGLang
			// without --enable-metrics): ready, load unknown (as with
			// --metrics-url -), not a dead engine.
			back := e.scrapeFails >= unreadyScrapeFails
			e.load = Load{}
			e.mu.Unlock()
			e.c.metricsMissing.Add(1)
			checked := e.answersAgain(ctx, back)
			if back {
				e.log.Info("engine answering again (no metrics): gossiped as ready", "restart_checked", checked)
			}
			if !e.warnedNoMetrics {
				e.warnedNoMetrics = true
				e.log.Warn("engine serves no metrics (404): routing it without load; start SGLang with --enable-metrics, or run the sidecar with --metrics-url - to stop scraping",
					"url", natsutil.RedactURL(url))
			}
		} else if err != nil {
			e.scrapeFails++
			e.scrapeErr = err.Error()
			lost := e.scrapeFails == unreadyScrapeFails // once per outage
			if lost {
				e.unreadySince = time.Now()
			}
			e.mu.Unlock()
			e.c.scrapeErrs.Add(1)
			e.log.Debug("engine metrics scrape failed", "url", natsutil.RedactURL(url), "err", err)
			if lost {
				e.log.Warn("engine not answering its metrics: gossiped as not ready, the ingresses stop routing to it",
					"url", natsutil.RedactURL(url), "failed_scrapes", unreadyScrapeFails, "err", err)
			}
		} else {
			back := e.scrapeFails >= unreadyScrapeFails
			since := e.unreadySince
			l.Scraped = time.Now()
			e.load = l
			if l.badGPUBlocks != e.warnedGPUBlocks {
				e.warnedGPUBlocks = l.badGPUBlocks // warned once per value
				if l.badGPUBlocks != "" {
					e.log.Warn("engine reports a KV capacity that is not a block count: ignored, the P/D kvwait term and llm-d's autotune stay off for it",
						"metric", cacheInfoName, "num_gpu_blocks", l.badGPUBlocks)
				}
			}
			e.watchSilence(l) // silent.go
			e.mu.Unlock()
			checked := e.answersAgain(ctx, back)
			if back {
				e.log.Info("engine answering its metrics again: gossiped as ready", "unready_for", time.Since(since).Round(time.Millisecond),
					"restart_checked", checked)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// restartCheckTimeout bounds how long an engine answering again after an
// outage stays not ready while the replay probe looks for its restart: a
// replay socket that does not answer (or none) must not keep it out.
const restartCheckTimeout = 5 * time.Second

// answersAgain is a good scrape; back: after enough failed ones that the
// engine was gossiped as not ready. Such an engine may have restarted
// meanwhile with an empty cache, which its events show only at its next
// batch or the next idle probe (up to a minute away after the outage's
// failed replays). So the event loop's subscriber probes now and the
// sidecar waits until the loop has applied what the probe found (a restart
// drops the dead engine's keys), bounded by restartCheckTimeout; then the
// failed scrapes are forgotten, which makes the engine ready again. A good
// scrape after a failure or two, the engine ready throughout, waits for no
// probe: the scrape loop (the gossiped load) must not stall for it. It
// reports whether the probe's findings were applied in time.
func (e *engine) answersAgain(ctx context.Context, back bool) bool {
	checked := false
	if back {
		checked = e.checkRestart(ctx)
	}
	e.mu.Lock()
	e.scrapeFails, e.scrapeErr = 0, ""
	e.mu.Unlock()
	return checked
}

// checkRestart runs a replay probe on the running subscriber and waits
// until the event loop has applied and published its messages.
func (e *engine) checkRestart(ctx context.Context) bool {
	e.mu.Lock()
	sub := e.sub
	e.mu.Unlock()
	if sub == nil || !sub.Replays() {
		return false // no replay endpoint: nothing can show the restart before its next events
	}
	ctx, cancel := context.WithTimeout(ctx, restartCheckTimeout)
	defer cancel()
	pos, err := sub.Probe(ctx)
	if err != nil {
		e.log.Debug("engine restart check by replay probe failed", "err", err)
		return false
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		e.mu.Lock()
		same, applied := e.sub == sub, e.taken >= pos
		e.mu.Unlock()
		if !same || applied {
			return same
		}
		select {
		case <-ctx.Done():
			e.log.Debug("engine restart check: the event loop did not apply the probe in time", "timeout", restartCheckTimeout)
			return false
		case <-t.C:
		}
	}
}

func scrape(ctx context.Context, client *http.Client, url string) (Load, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Load{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Load{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return Load{}, errNoMetrics
	}
	if resp.StatusCode != http.StatusOK {
		return Load{}, fmt.Errorf("scrape: status %d", resp.StatusCode)
	}
	return parseLoad(io.LimitReader(resp.Body, maxScrapeBytes))
}

// The engines' prefix-cache reset endpoints: vLLM's, and SGLang's (which has
// no /reset_prefix_cache; it refuses with 400 while requests run).
const (
	vllmResetPath   = "/reset_prefix_cache?reset_running_requests=true"
	sglangResetPath = "/flush_cache"
)

// resetLoop serves reset requests (reset-engine policy). A reset counts only
// when the engine's AllBlocksCleared event arrives: vLLM answers 200 even when
// it could not reset (requests were running), and older versions do not know
// reset_running_requests. Attempts are retried with backoff for a minute.
// The endpoint is vLLM's until it answers 404, then SGLang's; the one that
// worked is used from then on.
func (e *engine) resetLoop(ctx context.Context, client *http.Client) {
	const confirmWithin = 2 * time.Second
	path := vllmResetPath
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.resetCh:
		}
		deadline := time.Now().Add(time.Minute)
		bo := backoff.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
		for n := 0; ; n++ {
			before := e.c.clears.Load()
			var err error
			path, err = e.postReset(ctx, client, path)
			if err == nil && e.awaitClear(ctx, before, confirmWithin) {
				e.c.engineResets.Add(1)
				e.log.Info("engine prefix cache reset")
				break
			}
			if err == nil {
				err = fmt.Errorf("no AllBlocksCleared within %v", confirmWithin)
			}
			e.c.resetFailures.Add(1)
			e.log.Warn("engine prefix cache reset failed", "err", err)
			if time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			if !backoff.Sleep(ctx, bo.Delay(n)) {
				return
			}
		}
	}
}

// awaitClear waits until an AllBlocksCleared event arrives after before.
func (e *engine) awaitClear(ctx context.Context, before uint64, within time.Duration) bool {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(within)
	for e.c.clears.Load() == before {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// postReset posts the reset endpoint path and, when it is not found, the
// other engine kind's. It returns the path to use next time.
func (e *engine) postReset(ctx context.Context, client *http.Client, path string) (string, error) {
	status, err := postURL(ctx, client, e.cfg.URL+path)
	if status != http.StatusNotFound {
		return path, err
	}
	other := sglangResetPath
	if path == sglangResetPath {
		other = vllmResetPath
	}
	if status, err2 := postURL(ctx, client, e.cfg.URL+other); status != http.StatusNotFound {
		if err2 == nil {
			e.log.Info("engine prefix cache reset endpoint", "path", other)
		}
		return other, err2
	}
	return path, err
}

// postURL posts an empty body; status is 0 when there was no answer.
func postURL(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("reset: status %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
