package sidecar

import (
	"errors"
	"strings"
	"testing"
)

// An engine URL with a path (a pasted OpenAI base URL, ".../v1") is refused
// at start: the ingresses and the sidecar append /v1/... and /metrics to it,
// so every request would 404. A lone trailing slash is the same engine.
func TestEngineURLEndingInV1Refused(t *testing.T) {
	for _, tc := range []struct {
		url  string
		ok   bool
		want string // the URL New keeps
	}{
		{"http://127.0.0.1:8000", true, "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000/", true, "http://127.0.0.1:8000"},
		{"http://[::1]:8000/", true, "http://[::1]:8000"},
		// A path prefix behind a path-routing proxy is kept.
		{"http://gw:80/engines/a", true, "http://gw:80/engines/a"},
		{"http://gw:80/engines/a/", true, "http://gw:80/engines/a"},
		{"http://gw:80/v1x", true, "http://gw:80/v1x"},
		{"http://127.0.0.1:8000/v1", false, ""},
		{"http://127.0.0.1:8000/v1/", false, ""},
		{"https://engine.example:443/openai/v1", false, ""},
		{"https://engine.example:443/openai/v1/", false, ""},
		{"http://127.0.0.1:8000/?x=1", false, ""},
		{"http://127.0.0.1:8000#frag", false, ""},
	} {
		cfg := DefaultConfig()
		cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: tc.url}}
		s, err := New(cfg)
		if !tc.ok {
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "drop /v1") || !strings.Contains(err.Error(), tc.url) {
				t.Errorf("%s: %v, want a config error naming the URL and saying to drop /v1", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if got := s.engines[0].cfg; got.URL != tc.want || got.MetricsURL != tc.want+"/metrics" {
			t.Errorf("%s: url %q, metrics %q; want %q", tc.url, got.URL, got.MetricsURL, tc.want)
		}
	}
}

// TestValidateRefusesUndialable: an engine or metrics URL whose scheme is
// not http(s) or whose port is outside 1..65535, an admin address
// net.Listen refuses and an absurd block size are refused at start, by
// Validate (before NATS starts), not reported later as an engine that
// does not answer or an admin server that cannot bind.
func TestValidateRefusesUndialable(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Engines[0].URL = "ftp://127.0.0.1:8000" }, `scheme "ftp"`},
		{func(c *Config) { c.Engines[0].URL = "http://127.0.0.1:0" }, "port 0: want 1..65535"},
		{func(c *Config) { c.Engines[0].URL = "http://127.0.0.1:65536" }, "port 65536: want 1..65535"},
		{func(c *Config) { c.Engines[0].URL = "http://127.0.0.1:99999999999" }, "port 99999999999: want 1..65535"},
		{func(c *Config) { c.Engines[0].URL = "http://:8000" }, "no host"},
		{func(c *Config) { c.Engines[0].MetricsURL = "tcp://127.0.0.1:8000/metrics" }, `bad metrics url "tcp://`},
		{func(c *Config) { c.Engines[0].BlockSize = 99999999999 }, "block size 99999999999"},
		{func(c *Config) { c.AdminAddr = "bogus" }, `admin address "bogus"`},
		{func(c *Config) { c.AdminAddr = "127.0.0.1:65536" }, `admin address "127.0.0.1:65536"`},
	} {
		cfg := DefaultConfig()
		cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: "http://127.0.0.1:8000"}}
		tc.set(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v; want a config error with %q", err, tc.want)
		}
	}
	cfg := DefaultConfig()
	cfg.AdminAddr = ":0"
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: "https://engine.example",
		MetricsURL: "http://127.0.0.1:9000/metrics", BlockSize: 16}}
	if err := cfg.Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}
