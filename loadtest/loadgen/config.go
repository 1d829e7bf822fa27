package loadgen

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// Endpoint selects the OpenAI API the requests are sent to.
type Endpoint string

const (
	// Completions sends the workload's token ids as a pre-tokenized prompt to
	// /v1/completions: what the engine caches is exactly the workload's tokens.
	Completions Endpoint = "completions"
	// Chat sends /v1/chat/completions with the tokens rendered as words (one word per
	// token id), one user message per request; requests of one session share a prefix.
	Chat Endpoint = "chat"
	// Responses sends /v1/responses (the Responses API) with the tokens
	// rendered as words, like Chat, as the input string.
	Responses Endpoint = "responses"
	// Messages sends /v1/messages (Anthropic's Messages API, as vLLM serves
	// it) with the tokens rendered as words, like Chat. The API takes no
	// min_tokens or ignore_eos: an engine may stop before max_tokens.
	Messages Endpoint = "messages"
)

// Config configures a run. Arrivals are open-loop (each request is sent at its
// arrival time, whatever the latency of the others) and Concurrency caps how many are
// in flight; with every arrival at 0 (or Rate < 0) the run is closed-loop at
// Concurrency.
type Config struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
	URL string
	// URLs, when set, replaces URL with several servers (e.g. ingress replicas without
	// a load balancer in front): request i goes to URLs[i mod len].
	URLs []string
	// Endpoint is Completions (default), Chat, Responses or Messages.
	Endpoint Endpoint
	// Model is the model field of every request.
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <key>".
	APIKey string
	// N, when > 1, asks N sampled sequences per request ("n": parallel
	// sampling, as RL rollouts do): the engine decodes N answers to each
	// prompt. Completions and Chat only (the Responses and Messages APIs
	// have no n). 0 or 1: one.
	N int
	// Stream requests SSE streaming (needed for TTFT). Default true; set NoStream to
	// measure non-streaming requests (TTFT is then E2E).
	NoStream bool
	// StrictSSE reads streams only in the form vLLM (and kvmesh) writes
	// (openai.SSEReader): any other framing is a stream error. By default a
	// stream is read as the SSE standard allows (openai.LenientSSEReader)
	// and the report counts the requests whose framing was not vLLM's.
	StrictSSE bool
	// Concurrency caps requests in flight. Default 64. A request whose arrival comes
	// while the cap is reached waits; its latency is measured from when it is sent, and
	// the wait is reported separately (Report.SendLag).
	Concurrency int
	// Rate, when > 0, replaces the workload's arrival times with Poisson arrivals at
	// Rate requests/s (seeded by Seed); -1: every request arrives at 0 (closed loop).
	Rate float64
	// Seed fixes Rate's arrival times.
	Seed uint64
	// Timeout bounds one request end to end. Default 5 minutes.
	Timeout time.Duration
	// Headers are added to every request (e.g. routing hints for experiments).
	Headers map[string]string
	// SessionHeader, when set, sends each request's workload session id in this header
	// (e.g. "X-Session-ID").
	SessionHeader string
	// Progress, when set, is called every ProgressInterval from one goroutine with the
	// run's counters so far, and once at the end. It must not block for long.
	Progress func(Progress)
	// ProgressInterval defaults to 500 ms.
	ProgressInterval time.Duration
}

// DefaultConfig returns the defaults described on Config (URL and Model are required).
func DefaultConfig() Config {
	return Config{Endpoint: Completions, Concurrency: 64, Timeout: 5 * time.Minute, ProgressInterval: 500 * time.Millisecond}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Endpoint == "" {
		c.Endpoint = d.Endpoint
	}
	if c.Concurrency == 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = d.ProgressInterval
	}
	return c
}

// ErrConfig wraps every configuration problem.
var ErrConfig = errors.New("invalid loadgen config")

// Validate lists every problem.
func (c Config) Validate() error {
	var errs []error
	for _, raw := range c.targets() {
		if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%w: url %q is not an http(s) URL", ErrConfig, raw))
		}
	}
	if c.Endpoint != Completions && c.Endpoint != Chat && c.Endpoint != Responses && c.Endpoint != Messages {
		errs = append(errs, fmt.Errorf("%w: endpoint %q (want completions, chat, responses or messages)", ErrConfig, c.Endpoint))
	}
	if c.Model == "" {
		errs = append(errs, fmt.Errorf("%w: model is required", ErrConfig))
	}
	if c.N < 0 || c.N > openai.MaxN {
		errs = append(errs, fmt.Errorf("%w: n %d not in [0, %d]", ErrConfig, c.N, openai.MaxN))
	} else if c.N > 1 && (c.Endpoint == Responses || c.Endpoint == Messages) {
		errs = append(errs, fmt.Errorf("%w: n %d: the %s endpoint samples one answer (no n)", ErrConfig, c.N, c.Endpoint))
	}
	if math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || (c.Rate < 0 && c.Rate != -1) {
		errs = append(errs, fmt.Errorf("%w: rate %v (want requests/s ≥ 0, or -1 for a closed loop)", ErrConfig, c.Rate))
	}
	if c.Concurrency < 1 || c.Concurrency > 100_000 {
		errs = append(errs, fmt.Errorf("%w: concurrency %d not in [1, 100000]", ErrConfig, c.Concurrency))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: timeout %v <= 0", ErrConfig, c.Timeout))
	}
	if c.ProgressInterval <= 0 {
		errs = append(errs, fmt.Errorf("%w: progress interval %v <= 0", ErrConfig, c.ProgressInterval))
	}
	return errors.Join(errs...)
}

// targets is URLs, or URL alone.
func (c Config) targets() []string {
	if len(c.URLs) > 0 {
		return c.URLs
	}
	return []string{c.URL}
}
