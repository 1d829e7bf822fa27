// Package routes owns model routing rules: a versioned, strictly validated
// RouteConfig (apiVersion kvmesh.io/v1alpha1), the immutable Table built from
// it (match, weighted pick, fallback order, LoRA adapters, per-route rate
// limits) and the Watcher that hot-reloads it from a file. It knows nothing of
// HTTP or engines: the ingress asks a Table which model pool serves a request
// and in what order to fall back.
package routes

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The accepted type of a route config document.
const (
	APIVersion = "kvmesh.io/v1alpha1"
	Kind       = "RouteConfig"
)

// ErrConfig marks an invalid route config.
var ErrConfig = errors.New("invalid route config")

// MaxRoutes bounds a file's routes.
const MaxRoutes = 1024

// Limits bound on a route's inputs.
const (
	maxBackends = 64
	maxWeight   = 1_000_000
)

// Config is one RouteConfig document.
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// Routes are tried in order; the first whose match fits wins. A request
	// no route matches is served by the model it names, as without routes.
	Routes []RouteSpec `yaml:"routes"`
}

// RouteSpec is one routing rule as configured.
type RouteSpec struct {
	// Name identifies the route in logs, metrics and errors; unique.
	Name  string `yaml:"name"`
	Match Match  `yaml:"match"`
	// Backends are the model pools requests are split across by weight.
	// The target model is the pool of engines serving that model; the
	// upstream body's "model" is rewritten to it.
	Backends []Backend `yaml:"backends"`
	// Fallback is the ordered list of models tried when the picked backend's
	// pool has no healthy engine, or every attempt on it failed or was
	// overloaded before the first byte reached the client.
	Fallback []string `yaml:"fallback"`
	// LoRAAdapters are adapter names the route also accepts as the request's
	// model: such a request matches the route (besides Match.Model), is served
	// by the backends' pools, and keeps the adapter name upstream (the engine
	// serves the adapter under it).
	LoRAAdapters []string `yaml:"loraAdapters"`
	// RateLimit bounds the route's traffic on this replica. Zero: none.
	RateLimit RateLimit `yaml:"rateLimit"`
}

// Match selects requests. Every non-empty part must fit.
type Match struct {
	// Model is the request's "model": exact, or a prefix ending in "*"
	// ("llama-*"). Empty: any model (LoRAAdapters still match).
	Model string `yaml:"model"`
	// Headers must all be present with exactly these values (names are
	// case-insensitive, values case-sensitive).
	Headers map[string]string `yaml:"headers"`
	// PathPrefix must prefix the request path ("/v1/chat/"). Empty: any.
	PathPrefix string `yaml:"pathPrefix"`
}

// Backend is one weighted target of a route.
type Backend struct {
	Model string `yaml:"model"`
	// Weight is the share of requests, relative to the route's other
	// backends. Default 1; 0 takes no requests (kept for a quick drain).
	Weight *int `yaml:"weight"`
}

// RateLimit is a per-route budget, enforced per ingress replica with token
// buckets (burst = one minute's budget).
type RateLimit struct {
	RequestsPerMinute    int `yaml:"requestsPerMinute"`
	InputTokensPerMinute int `yaml:"inputTokensPerMinute"`
}

// Parse decodes a RouteConfig strictly (unknown fields are errors), applies
// defaults and validates it, listing every problem.
func Parse(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: decode: %w", ErrConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: want exactly one YAML document", ErrConfig)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Load reads and parses a RouteConfig file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Defaults fills unset fields: a backend weight of 1.
func (c *Config) Defaults() {
	for i := range c.Routes {
		for j := range c.Routes[i].Backends {
			if c.Routes[i].Backends[j].Weight == nil {
				one := 1
				c.Routes[i].Backends[j].Weight = &one
			}
		}
	}
}

// Validate reports every problem in c (after Defaults), or nil.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if c.APIVersion != APIVersion {
		bad("apiVersion must be %q, got %q", APIVersion, c.APIVersion)
	}
	if c.Kind != Kind {
		bad("kind must be %q, got %q", Kind, c.Kind)
	}
	if len(c.Routes) > MaxRoutes {
		bad("at most %d routes, got %d", MaxRoutes, len(c.Routes))
	}
	names := map[string]bool{}
	for i := range c.Routes {
		r := &c.Routes[i]
		at := fmt.Sprintf("routes[%d]", i)
		if r.Name != "" {
			at = fmt.Sprintf("routes[%d] %q", i, r.Name)
		}
		r.problems(at, names, bad)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrConfig, strings.Join(probs, "; "))
	}
	return nil
}

func (r *RouteSpec) problems(at string, names map[string]bool, bad func(string, ...any)) {
	switch {
	case r.Name == "":
		bad("%s: name is required", at)
	case names[r.Name]:
		bad("%s: duplicate name", at)
	case !validName(r.Name):
		bad("%s: name must be printable ASCII without spaces", at)
	}
	names[r.Name] = true
	m := r.Match.Model
	if strings.Contains(strings.TrimSuffix(m, "*"), "*") {
		bad("%s: match.model %q: '*' is allowed only at the end", at, m)
	}
	for k, v := range r.Match.Headers {
		if k == "" || !validName(k) {
			bad("%s: match.headers: invalid header name %q", at, k)
		}
		if strings.ContainsAny(v, "\r\n") {
			bad("%s: match.headers[%s]: value has a line break", at, k)
		}
	}
	if p := r.Match.PathPrefix; p != "" && !strings.HasPrefix(p, "/") {
		bad("%s: match.pathPrefix %q must start with '/'", at, p)
	}
	if len(r.Backends) == 0 {
		bad("%s: at least one backend is required", at)
	}
	if len(r.Backends) > maxBackends {
		bad("%s: at most %d backends, got %d", at, maxBackends, len(r.Backends))
	}
	total, seen := 0, map[string]bool{}
	for j, b := range r.Backends {
		if b.Model == "" {
			bad("%s: backends[%d]: model is required", at, j)
		} else if seen[b.Model] {
			bad("%s: backends[%d]: duplicate model %q", at, j, b.Model)
		}
		seen[b.Model] = true
		if w := b.Weight; w != nil {
			if *w < 0 || *w > maxWeight {
				bad("%s: backends[%d]: weight must be in 0..%d, got %d", at, j, maxWeight, *w)
			} else {
				total += *w
			}
		}
	}
	if len(r.Backends) > 0 && total == 0 {
		bad("%s: backend weights sum to 0", at)
	}
	fb := map[string]bool{}
	for j, f := range r.Fallback {
		if f == "" {
			bad("%s: fallback[%d]: empty model", at, j)
		} else if fb[f] {
			bad("%s: fallback[%d]: duplicate model %q", at, j, f)
		}
		fb[f] = true
	}
	ad := map[string]bool{}
	for j, a := range r.LoRAAdapters {
		if a == "" || strings.Contains(a, "*") {
			bad("%s: loraAdapters[%d]: %q must be a non-empty exact name", at, j, a)
		} else if ad[a] {
			bad("%s: loraAdapters[%d]: duplicate %q", at, j, a)
		}
		ad[a] = true
	}
	if r.RateLimit.RequestsPerMinute < 0 {
		bad("%s: rateLimit.requestsPerMinute must be >= 0", at)
	}
	if r.RateLimit.InputTokensPerMinute < 0 {
		bad("%s: rateLimit.inputTokensPerMinute must be >= 0", at)
	}
}

func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return len(s) > 0 && len(s) <= 253
}
