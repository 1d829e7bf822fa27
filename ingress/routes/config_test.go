package routes

import (
	"errors"
	"strings"
	"testing"
)

const exampleYAML = `apiVersion: kvmesh.io/v1alpha1
kind: RouteConfig
routes:
  - name: chat-canary
    match:
      model: chat
      headers: {X-Tenant: beta}
      pathPrefix: /v1/chat/
    backends:
      - {model: llama-8b, weight: 80}
      - {model: llama-8b-next, weight: 20}
    fallback: [llama-1b]
    loraAdapters: [sql-lora, support-lora]
    rateLimit: {requestsPerMinute: 600, inputTokensPerMinute: 100000}
  - name: llamas
    match: {model: "llama-*"}
    backends: [{model: llama-8b}]
`

func TestParseExample(t *testing.T) {
	c, err := Parse([]byte(exampleYAML))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 2 || *c.Routes[1].Backends[0].Weight != 1 || *c.Routes[0].Backends[1].Weight != 20 {
		t.Fatalf("decoded %+v", c)
	}
}

func TestParseErrors(t *testing.T) {
	head := "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\n"
	cases := []struct {
		name, yaml string
		want       []string // every one must appear in the error
	}{
		{"unknown field", head + "routes: [{name: a, backends: [{model: m}], wieght: 3}]", []string{"wieght"}},
		{"unknown top field", head + "extra: 1", []string{"extra"}},
		{"wrong version and kind", "apiVersion: v1\nkind: Route\n", []string{`apiVersion must be "kvmesh.io/v1alpha1"`, `kind must be "RouteConfig"`}},
		{"every route problem listed", head + `routes:
  - name: a
    match: {model: "ll*ama", pathPrefix: v1, headers: {"": x}}
    backends: [{model: m, weight: -1}, {model: m}, {model: ""}]
    fallback: [x, x, ""]
    loraAdapters: ["a*"]
    rateLimit: {requestsPerMinute: -1, inputTokensPerMinute: -2}
  - name: a
    backends: []
  - backends: [{model: m, weight: 0}]
`, []string{"'*' is allowed only at the end", "must start with '/'", "invalid header name", "weight must be in 0..",
			`duplicate model "m"`, "backends[2]: model is required", `fallback[1]: duplicate model "x"`, "fallback[2]: empty model",
			"loraAdapters[0]", "requestsPerMinute must be >= 0", "inputTokensPerMinute must be >= 0",
			`routes[1] "a": duplicate name`, "at least one backend", "routes[2]: name is required", "weights sum to 0"}},
		{"two documents", head + "---\n" + head, []string{"exactly one YAML document"}},
		{"not yaml", "{[", []string{"decode"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(exampleYAML))
	f.Add([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: [{name: a, backends: [{model: m, weight: 0}]}]"))
	f.Add([]byte("routes: [{name: a, match: {model: '*'}}]"))
	f.Add([]byte("{}"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error does not wrap ErrConfig: %v", err)
			}
			return
		}
		// A valid config compiles, and every route picks one of its backends.
		tb := NewTable(c, nil)
		for i := range tb.routes {
			r := &tb.routes[i]
			for _, x := range []uint64{0, 1, 1 << 63, ^uint64(0)} {
				m := r.Pick(x)
				if !containsBackend(c.Routes[i].Backends, m) {
					t.Fatalf("route %q picked %q", r.name, m)
				}
			}
		}
	})
}

func containsBackend(bs []Backend, m string) bool {
	for _, b := range bs {
		if b.Model == m && *b.Weight > 0 {
			return true
		}
	}
	return false
}
