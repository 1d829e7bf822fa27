package policies_test

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// llmdPick builds policy llmd from a SchedulerConfig file through the
// registry and picks between a, where the router sent the whole 10-block
// prompt before but which has 4 requests waiting, and b, which got nothing
// and has none.
func llmdPick(t *testing.T, llmdBlock string) string {
	t.Helper()
	cfg, err := registry.ParseConfig([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\npolicy: llmd\n" + llmdBlock))
	if err != nil {
		t.Fatal(err)
	}
	p, err := registry.Policy(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	es := []scheduler.Engine{
		{ID: "a", Healthy: true, Waiting: 4, KVUsage: 0.5},
		{ID: "b", Healthy: true, Waiting: 0, KVUsage: 0.5},
	}
	ms := []index.Match{{GPU: 10, CPU: 10, Other: 10}, {}}
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	req := &scheduler.Request{Keys: keys, BlockSize: 16, PromptTokens: 160, OutputTokens: 64}
	// llmd's default prefix scorer is the approximate one: a holds the
	// prompt because the router sent it there before.
	p.(policies.LLMDApproximate).History.Insert("a", keys)
	cs := make([]scheduler.Candidate, len(es))
	for i := range es {
		cs[i] = scheduler.Candidate{Engine: &es[i], Match: ms[i]}
	}
	var cyc scheduler.Cycle
	i, _ := p.Pick(req, cs, &cyc)
	return cs[i].ID
}

// TestLLMDWeightsFromConfig: the llmd block's weights reach the policy and
// change its choice (score a = 3·prefix + 2·0 + 2·0.5, b = 0 + 2·queue + 2·0.5).
func TestLLMDWeightsFromConfig(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"", "a"}, // defaults: prefix 3 beats queue 2
		{"llmd: {queueWeight: 2, kvUtilizationWeight: 2, prefixWeight: 3}\n", "a"},
		{"llmd: {prefixWeight: 1}\n", "b"},  // prefix 1 loses to queue 2
		{"llmd: {queueWeight: 4}\n", "b"},   // queue 4 beats prefix 3
		{"llmd: {queueWeight: 0}\n", "a"},   // no queue term at all
		{"llmd: {prefixWeight: 0}\n", "b"},  // no prefix term at all
		{"llmd: {queueWeight: 2.9}\n", "a"}, // 3 still beats 2.9
	} {
		if got := llmdPick(t, tc.block); got != tc.want {
			t.Errorf("%q: picked %s, want %s", tc.block, got, tc.want)
		}
	}
}

func TestNewLLMD(t *testing.T) {
	w, err := policies.NewLLMD(policies.DefaultLLMDWeights())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w, policies.LLMD()) || w.Scale != 1.0/7 {
		t.Fatalf("NewLLMD(defaults) = %+v, LLMD() = %+v", w, policies.LLMD())
	}
	if d, c := policies.DefaultLLMDWeights(), policies.DefaultLLMDConfig(); d.Queue != c.QueueWeight || d.KVUtilization != c.KVUtilizationWeight || d.Prefix != c.PrefixWeight {
		t.Fatalf("policies default %+v, config default %+v", d, c)
	}
	w, err = policies.NewLLMD(policies.LLMDWeights{Prefix: 4})
	if err != nil || w.Scale != 0.25 {
		t.Fatalf("prefix only: %+v, %v", w, err)
	}
	for _, bad := range []policies.LLMDWeights{{}, {Queue: -1, Prefix: 2}, {Queue: math.NaN(), Prefix: 1}, {Prefix: math.Inf(1)}, {Queue: math.MaxFloat64, Prefix: math.MaxFloat64}} {
		if p, err := policies.NewLLMD(bad); p != nil || !errors.Is(err, scheduler.ErrConfig) {
			t.Errorf("NewLLMD(%+v) = %v, %v", bad, p, err)
		}
	}
}
