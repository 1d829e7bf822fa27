package ingress

import (
	"errors"
	"testing"
)

// FuzzParseConfig: any YAML either decodes or fails with ErrConfig; a
// decoded config validates (or lists its problems with ErrConfig) and
// redacts without panicking.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"",
		"listen: 127.0.0.1:9000\nmaxAttempts: 2\n",
		"engines:\n- {id: a, model: m, url: http://127.0.0.1:1}\n",
		"engines:\n- {id: p, model: m, url: http://127.0.0.1:1, role: prefill, group: g, pdProtocol: sglang, bootstrap: \"127.0.0.1:8998\"}\n",
		"cluster: {gossipBind: '127.0.0.1:0', natsURLs: [nats://u:p@h:4222], natsAuth: {user: u}}\n",
		"health: {consecutiveFailures: 0, errorRate: 2}\ntls: {certFile: x}\n",
		"scheduler: {policy: kvmesh}\n",
		"fairQueue: {maxConcurrent: 8, tenants: {a: {priority: 1}, b: {weight: 3}}, default: {priority: 2}}\ntenantHeader: X-T\n",
		"unknownField: 1\n",
		"listen: [1, 2\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := ParseConfig(b)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil && !errors.Is(err, ErrConfig) {
			t.Fatalf("validate: %v does not wrap ErrConfig", err)
		}
		_ = redactConfig(cfg)
	})
}

// FuzzParseStaticEngine: the --engine form parses or fails with ErrConfig.
func FuzzParseStaticEngine(f *testing.F) {
	for _, s := range []string{"m=http://127.0.0.1:8000", "id=m=http://h:1", "x", "=", "a=b=c=d", "m=%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseStaticEngine(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			return
		}
		if e.URL == "" && e.Model == "" && e.ID == "" && s != "==" && s != "=" {
			t.Logf("empty engine from %q", s) // Validate rejects it
		}
	})
}
