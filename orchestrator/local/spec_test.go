package local

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/ingress/routes"
)

const pdSpec = `# a P/D deployment and its policy
apiVersion: kvmesh.io/v1alpha1
kind: ModelDeployment
metadata:
  name: demo
spec:
  model: kvmesh-sim
  engine: vllm
  roles:
    - {name: prefill, kind: prefill, replicas: 1, template: {}}
    - {name: decode, kind: decode, replicas: 1, template: {}}
---
apiVersion: kvmesh.io/v1alpha1
kind: AutoscalingPolicy
metadata:
  name: demo
spec:
  target: demo
  roles:
    - {name: prefill, minReplicas: 1, maxReplicas: 3, metrics: [{name: waitingRequests, target: 4}]}
    - {name: decode, minReplicas: 1, maxReplicas: 3, metrics: [{name: runningRequests, target: 8}]}
  ratio: {numeratorRole: prefill, denominatorRole: decode, minRatio: 0.5, maxRatio: 2}
`

// routeDoc routes the client-facing model "chat" to demo's model.
const routeDoc = `---
apiVersion: kvmesh.io/v1alpha1
kind: ModelRoute
metadata: {name: chat}
spec: {match: {model: chat}, backends: [{model: kvmesh-sim}]}
`

func TestParseSpec(t *testing.T) {
	s, err := ParseSpec([]byte(pdSpec))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Deployments) != 1 || len(s.Policies) != 1 || s.policyFor("demo") == nil {
		t.Fatalf("parsed %+v", s)
	}
	md := s.Deployments[0]
	if md.Spec.RecoveryPolicy != "RoleRecreate" || *md.Spec.Groups != 1 {
		t.Errorf("defaults not applied: %+v", md.Spec)
	}
	bad := []struct{ name, doc, want string }{
		{"no deployment", "", "no ModelDeployment"},
		{"unknown kind", "apiVersion: kvmesh.io/v1alpha1\nkind: Pod\nmetadata: {name: x}\n", `kind "Pod"`},
		{"wrong version", "apiVersion: v1\nkind: ModelDeployment\n", "apiVersion"},
		{"unknown field", strings.Replace(pdSpec, "engine: vllm", "engine: vllm\n  bogus: 1", 1), "bogus"},
		{"bad role kind", strings.Replace(pdSpec, "kind: decode", "kind: worker", 1), `kind "worker"`},
		{"missing target", strings.Replace(pdSpec, "target: demo", "target: other", 1), `"other" not in the file`},
		{"policy role missing", strings.Replace(pdSpec, "{name: decode, minReplicas", "{name: dec, minReplicas", 1), `role "dec"`},
		{"bad band", strings.Replace(pdSpec, "minRatio: 0.5", "minRatio: 3", 1), "ratio minRatio 3 above maxRatio 2 (inverted band)"},
		{"two groups", strings.Replace(pdSpec, "engine: vllm", "engine: vllm\n  groups: 2", 1), "one group"},
		{"too many replicas", strings.Replace(pdSpec, "replicas: 1,", "replicas: 99,", 1), "replicas 99"},
		{"not yaml", "apiVersion: [", "document 1"},
		{"invalid route", pdSpec + strings.Replace(routeDoc, "{model: kvmesh-sim}", "{model: kvmesh-sim, weight: 0}", 1), `ModelRoute "chat"`},
		{"route twice", pdSpec + routeDoc + routeDoc, `ModelRoute "chat" twice`},
		{"route field", pdSpec + strings.Replace(routeDoc, "match:", "matches:", 1), "matches"},
		{"aggregateBelow on sglang", strings.Replace(strings.Replace(pdSpec, "engine: vllm", "engine: sglang", 1),
			"  ratio:", "  slo: {prefillRole: prefill, decodeRole: decode, ttftMilliseconds: 2000, tpotMilliseconds: 50, aggregateBelow: 0.8}\n  ratio:", 1),
			`slo.aggregateBelow 0.8 on ModelDeployment "demo", which runs sglang`},
		{"decode can stay at zero", strings.Replace(strings.Replace(pdSpec, "{name: decode, minReplicas: 1", "{name: decode, minReplicas: 0", 1),
			"  ratio: {numeratorRole: prefill, denominatorRole: decode, minRatio: 0.5, maxRatio: 2}\n", "", 1), `role decode: minReplicas 0`},
	}
	// A role at zero beside one at 1 or more in a ratio band is seeded back.
	if _, err := ParseSpec([]byte(strings.Replace(pdSpec, "{name: decode, minReplicas: 1", "{name: decode, minReplicas: 0", 1))); err != nil {
		t.Errorf("decode min 0 in a band with prefill min 1: %v", err)
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(c.doc))
			if err == nil || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrSpec mentioning %q", err, c.want)
			}
		})
	}
}

// TestParseExamples: the examples a Kubernetes user applies run locally too.
// TestParseSpecSchema: what the CRD schemas refuse is refused here too,
// each problem naming its field, every problem of a file listed together.
func TestParseSpecSchema(t *testing.T) {
	edit := func(pairs ...string) string {
		out := pdSpec
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(out, pairs[i]) {
				t.Fatalf("%q not in the spec", pairs[i])
			}
			out = strings.Replace(out, pairs[i], pairs[i+1], 1)
		}
		return out
	}
	for _, c := range []struct {
		name string
		doc  string
		want []string
	}{
		{"recoveryPolicy enum", edit("engine: vllm", "engine: vllm\n  recoveryPolicy: Groupcreate"),
			[]string{`ModelDeployment "demo": recoveryPolicy "Groupcreate", want GroupRecreate, RoleRecreate or None`}},
		{"engine enum", edit("engine: vllm", "engine: vlm"), []string{`ModelDeployment "demo": engine "vlm", want vllm or sglang`}},
		{"engine missing", edit("  engine: vllm\n", ""), []string{`engine "", want vllm or sglang`}},
		{"gangMinimum above replicas", edit("{name: prefill, kind: prefill, replicas: 1,", "{name: prefill, kind: prefill, replicas: 1, gangMinimum: 3,"),
			[]string{`role "prefill": gangMinimum 3 not in [0, replicas 1]`}},
		{"gangMinimum above default replicas", edit("{name: prefill, kind: prefill, replicas: 1,", "{name: prefill, kind: prefill, gangMinimum: 2,"),
			[]string{`role "prefill": gangMinimum 2 not in [0, replicas 1]`}},
		{"unknown metric and non-positive target", edit("{name: waitingRequests, target: 4}", "{name: bogusMetric, target: 4}",
			"{name: runningRequests, target: 8}", "{name: runningRequests, target: -4}"),
			[]string{`AutoscalingPolicy "demo" role "prefill": metric name "bogusMetric", want one of waitingRequests`,
				`AutoscalingPolicy "demo" role "decode" metric "runningRequests": target -4, want a number above 0`}},
		{"zero target", edit("{name: runningRequests, target: 8}", "{name: runningRequests, target: 0}"), []string{`target 0, want a number above 0`}},
		{"metric source", edit("{name: runningRequests, target: 8}", "{name: runningRequests, target: 8, source: graphite}"),
			[]string{`source "graphite", want mesh or prometheus`}},
		{"metrics the local backend does not measure", edit("{name: runningRequests, target: 8}", "{name: tpotP90Seconds, target: 0.05, source: prometheus, query: x}"),
			[]string{`role "decode": metric "tpotP90Seconds" is not measured by the local backend`,
				`metric "tpotP90Seconds": source prometheus is not read by the local backend`}},
		{"min above max", edit("{name: prefill, minReplicas: 1, maxReplicas: 3", "{name: prefill, minReplicas: 5, maxReplicas: 2"),
			[]string{`AutoscalingPolicy "demo" role "prefill": minReplicas 5 above maxReplicas 2`}},
		{"max below 1", edit("{name: prefill, minReplicas: 1, maxReplicas: 3", "{name: prefill, minReplicas: 0, maxReplicas: 0"),
			[]string{`role "prefill": maxReplicas 0 below 1`}},
		{"ratio role missing", edit("denominatorRole: decode", "denominatorRole: x"),
			[]string{`AutoscalingPolicy "demo": ratio denominatorRole "x" is not a role of the policy`}},
		{"ratio inverted", edit("minRatio: 0.5, maxRatio: 2", "minRatio: 2, maxRatio: 0.5"),
			[]string{`ratio minRatio 2 above maxRatio 0.5 (inverted band)`}},
		{"ratio one role", edit("denominatorRole: decode", "denominatorRole: prefill"), []string{`numeratorRole and denominatorRole are both "prefill"`}},
		{"ratio zero", edit("minRatio: 0.5", "minRatio: 0"), []string{`ratio minRatio 0, want a number above 0`}},
		{"windows", edit("target: demo", "target: demo\n  stableWindowSeconds: 30\n  panicWindowSeconds: 60\n  tolerancePercent: 101\n  maxScaleUpRate: 0.5"),
			[]string{"stableWindowSeconds 30 below panicWindowSeconds 60", "tolerancePercent 101 not in [0, 100]", "maxScaleUpRate 0.5"}},
		{"every problem listed", edit("engine: vllm", "engine: vlm\n  recoveryPolicy: Groupcreate", "{name: waitingRequests, target: 4}", "{name: bogusMetric, target: 4}"),
			[]string{`engine "vlm"`, `recoveryPolicy "Groupcreate"`, `metric name "bogusMetric"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(c.doc))
			if err == nil || !errors.Is(err, ErrSpec) {
				t.Fatalf("err = %v, want ErrSpec", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "both roles must be scaled") || strings.Contains(err.Error(), "bounds [") {
				t.Errorf("err = %v: the unnamed autoscale message repeats a named one", err)
			}
		})
	}
	// Every value the schemas admit is admitted, but the metrics the local
	// backend cannot read (latency percentiles, Prometheus: refused above).
	for _, ok := range []string{
		edit("engine: vllm", "engine: sglang\n  recoveryPolicy: None"),
		edit("engine: vllm", "engine: vllm\n  recoveryPolicy: GroupRecreate", "{name: prefill, kind: prefill, replicas: 1,", "{name: prefill, kind: prefill, replicas: 2, gangMinimum: 2,"),
		edit("{name: waitingRequests, target: 4}", "{name: prefillQueueTokens, target: 2048}, {name: kvUsage, target: 0.8}",
			"{name: runningRequests, target: 8}", "{name: runningRequests, target: 8, source: mesh}"),
	} {
		if _, err := ParseSpec([]byte(ok)); err != nil {
			t.Errorf("refused: %v\n%s", err, ok)
		}
	}
	// A document that does not decode is not also "no ModelDeployment".
	for _, doc := range []string{"apiVersion: kvmesh.io/v1alpha1\nkind: ModelDeployment\nspec: [\n", "apiVersion: kvmesh.io/v1alpha1\nkind: Pod\n"} {
		if _, err := ParseSpec([]byte(doc)); err == nil || strings.Contains(err.Error(), "no ModelDeployment") {
			t.Errorf("%q: err = %v, want the document's problem alone", doc, err)
		}
	}
}

func TestParseExamples(t *testing.T) {
	md, err := os.ReadFile("../../examples/pd-modeldeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ap, err := os.ReadFile("../../examples/autoscalingpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mr, err := os.ReadFile("../../examples/modelroutes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSpec([]byte(string(md) + "\n---\n" + string(ap) + "\n---\n" + string(mr)))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Deployments) != 1 || s.policyFor(s.Deployments[0].Name) == nil || !s.hasPD() || len(s.Routes) != 2 {
		t.Fatalf("examples parsed to %+v", s)
	}
	// The route file the local ingress gets: the example's two routes,
	// higher priority first, as the ingress parses it.
	c, err := routes.Parse([]byte(s.RouteFile))
	if err != nil || len(c.Routes) != 2 || c.Routes[0].Name != "chat-canary" || c.Routes[1].Name != "chat" {
		t.Fatalf("route file %v:\n%s", err, s.RouteFile)
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(pdSpec))
	f.Add([]byte(pdSpec + routeDoc))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: AutoscalingPolicy\nspec: {roles: [{}]}\n"))
	f.Add([]byte(strings.Replace(pdSpec, "replicas: 1,", "replicas: -5,", 1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSpec(b)
		if err != nil {
			if !errors.Is(err, ErrSpec) {
				t.Fatalf("error without ErrSpec: %v", err)
			}
			return
		}
		for _, md := range s.Deployments {
			for _, r := range md.Spec.Roles {
				if r.Replicas == nil || *r.Replicas < 0 || *r.Replicas > maxReplicas {
					t.Fatalf("accepted replicas %v", r.Replicas)
				}
			}
		}
	})
}

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	h := histogram{bounds: []float64{0.1, 0.5, 1, inf}, counts: []float64{50, 90, 100, 100}}
	if q := h.quantile(0.5); q != 0.1 {
		t.Errorf("p50 = %v, want 0.1", q)
	}
	if q := h.quantile(0.9); q != 0.5 {
		t.Errorf("p90 = %v, want 0.5", q)
	}
	if q := h.quantile(0.95); q < 0.74 || q > 0.76 {
		t.Errorf("p95 = %v, want 0.75 (interpolated)", q)
	}
	earlier := histogram{bounds: h.bounds, counts: []float64{50, 50, 50, 50}}
	d := h.sub(earlier)
	if q := d.quantile(0.9); q < 0.5 || q > 1 {
		t.Errorf("delta p90 = %v, want within (0.5, 1]", q)
	}
	if (histogram{}).quantile(0.9) != 0 {
		t.Error("empty histogram has a quantile")
	}
	if got := h.add(h).counts[3]; got != 200 {
		t.Errorf("add: %v", got)
	}
}

func TestParseEngineSample(t *testing.T) {
	text := `# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 1200
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1"} 3
vllm:time_to_first_token_seconds_bucket{le="1"} 4
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4
vllm:time_to_first_token_seconds_sum 1
vllm:time_to_first_token_seconds_count 4
`
	s, err := parseEngineSample(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.promptTokens != 1200 || len(s.ttft.bounds) != 3 || s.ttft.counts[1] != 4 {
		t.Fatalf("sample %+v", s)
	}
	if _, err := parseEngineSample(strings.NewReader("vllm:x{ 1\n")); err == nil {
		t.Error("malformed exposition accepted")
	}
}
