package filters

import (
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
)

func TestFilters(t *testing.T) {
	c := func(e scheduler.Engine) *scheduler.Candidate { return &scheduler.Candidate{Engine: &e} }
	r := &scheduler.Request{Model: "m", Role: scheduler.RolePrefill, LoRA: "ad"}
	cases := []struct {
		name string
		f    scheduler.Filter
		e    scheduler.Engine
		want bool
	}{
		{"healthy", Health{}, scheduler.Engine{Healthy: true}, true},
		{"unhealthy", Health{}, scheduler.Engine{}, false},
		{"same model", Model{}, scheduler.Engine{Model: "m"}, true},
		{"other model", Model{}, scheduler.Engine{Model: "x"}, false},
		{"prefill role", Role{}, scheduler.Engine{Role: scheduler.RolePrefill}, true},
		{"mixed role", Role{}, scheduler.Engine{Role: scheduler.RoleMixed}, true},
		{"decode role", Role{}, scheduler.Engine{Role: scheduler.RoleDecode}, false},
		{"waiting under", MaxWaiting{Limit: 3}, scheduler.Engine{Waiting: 3}, true},
		{"waiting over", MaxWaiting{Limit: 3}, scheduler.Engine{Waiting: 4}, false},
		{"waiting off", MaxWaiting{}, scheduler.Engine{Waiting: 400}, true},
		// A burst the snapshot has not seen: in flight beyond the running batch.
		{"in flight over", MaxWaiting{Limit: 3}, scheduler.Engine{Running: 8, InFlight: 12}, false},
		{"in flight under", MaxWaiting{Limit: 3}, scheduler.Engine{Running: 8, InFlight: 11}, true},
		{"in flight running", MaxWaiting{Limit: 3}, scheduler.Engine{Running: 8, InFlight: 8, Waiting: 2}, true},
		{"lora loaded", LoRA{Strict: true}, scheduler.Engine{LoRAs: []string{"ad"}}, true},
		{"lora missing strict", LoRA{Strict: true}, scheduler.Engine{}, false},
		{"lora missing lax", LoRA{}, scheduler.Engine{}, true},
	}
	for _, tc := range cases {
		if got := tc.f.Keep(r, c(tc.e)); got != tc.want {
			t.Errorf("%s: %s kept=%v, want %v", tc.name, tc.f.Name(), got, tc.want)
		}
	}
	if _, ok := scheduler.ParseRole("decode"); !ok {
		t.Fatal("ParseRole")
	}
	if _, ok := scheduler.ParseRole("bogus"); ok {
		t.Fatal("ParseRole accepted bogus")
	}
}
