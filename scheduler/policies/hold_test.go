package policies

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

func TestHoldRoom(t *testing.T) {
	h := Hold{Seconds: 2}
	if !h.Room(19999, 10000) || h.Room(20000, 10000) {
		t.Error("room must end at Seconds × rate queued tokens")
	}
	if !h.Room(1e9, 0) {
		t.Error("an engine without a rate estimate always has room")
	}
	if (Hold{}).On() || !h.On() {
		t.Error("On must follow Seconds")
	}
}

func TestHoldKeyAges(t *testing.T) {
	h := Hold{Seconds: 2, Aging: 0.5}
	long := h.Key(40000, 10000, 0)              // 4 s of prefill, held first
	short := h.Key(10000, 10000, 4*time.Second) // 1 s of prefill, held 4 s later
	if !(short < long) {
		t.Errorf("a prompt 3 s shorter held 4 s later (aging 2 s) goes first: short %v, long %v", short, long)
	}
	shorter := h.Key(10000, 10000, 8*time.Second) // held 8 s later: aging 4 s > the 3 s it saves
	if !(long < shorter) {
		t.Errorf("after 8 s the long prompt goes first: long %v, later short %v", long, shorter)
	}
}

func TestHoldPick(t *testing.T) {
	h := Hold{Seconds: 2, Affinity: 0.5}
	mk := func() scheduler.Decision {
		return scheduler.Decision{Engine: "a", Reason: "prefix-affinity", Ranked: []scheduler.EngineScore{
			{Engine: "a", Match: index.Match{Spec: 10}}, // 160 of 1,000 tokens
			{Engine: "b"},
			{Engine: "c", Match: index.Match{Spec: 40}}, // 640 of 1,000 tokens
		}}
	}
	for _, tc := range []struct {
		name string
		room map[string]bool
		want string
	}{
		{"best has room", map[string]bool{"a": true, "b": true}, "a"},
		{"next with room", map[string]bool{"b": true}, "b"},
		{"affinity without room", map[string]bool{}, "c"},
	} {
		d := mk()
		h.Pick(&d, 1000, 16, func(e string) bool { return tc.room[e] })
		if d.Engine != tc.want || d.Ranked[0].Engine != tc.want || len(d.Ranked) != 3 {
			t.Errorf("%s: picked %s, ranking %v", tc.name, d.Engine, d.Ranked)
		}
	}
	d := mk()
	Hold{Seconds: 2}.Pick(&d, 1000, 16, func(string) bool { return false })
	if d.Engine != "a" {
		t.Errorf("no engine qualifies: the ranking must stay, got %s", d.Engine)
	}
}

// TestHoldPickEngineBlockSize: an engine's match counts blocks of its own
// size (EngineScore.MatchBlock, engines of one model with different block
// sizes): 16 blocks of 32 tokens are half a 1,024-token prompt, enough for
// Affinity 0.5, where 16 blocks of the request's 16 would be a quarter.
func TestHoldPickEngineBlockSize(t *testing.T) {
	h := Hold{Seconds: 2, Affinity: 0.5}
	d := scheduler.Decision{Engine: "a", Ranked: []scheduler.EngineScore{
		{Engine: "a"},
		{Engine: "b", Match: index.Match{GPU: 16, CPU: 16, Other: 16, Spec: 16}, MatchBlock: 32},
	}}
	h.Pick(&d, 1024, 16, func(string) bool { return false })
	if d.Engine != "b" || d.Ranked[0].Engine != "b" {
		t.Fatalf("picked %s (%+v); want b, holding half the prompt in blocks of 32", d.Engine, d.Ranked)
	}
}
