package policies

import (
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// TestDynamoOverlapInRequestBlocks: Dynamo's overlap credit is in the
// request's blocks (16 tokens here), as its prefill and decode blocks are,
// whatever the block size of the engine's Match (MatchBlock): a block-32
// engine holding the whole 64-block prompt in 32 of its blocks scores as a
// block-16 engine holding it in 64. Its 32 blocks taken as 16-token ones
// left half the prompt to prefill.
func TestDynamoOverlapInRequestBlocks(t *testing.T) {
	tests := []struct {
		name  string
		block int // MatchBlock (0: not set, the request's)
		match index.Match
		want  float64 // −(prefill + decode), in blocks of 16
	}{
		{name: "block 16, all 64 blocks on GPU", block: 16, match: full(64), want: -(0 + 64)},
		{name: "block 32, all 32 of its blocks on GPU", block: 32, match: full(32), want: -(0 + 64)},
		{name: "block unset: the request's", match: full(32), want: -(32 + 64)},
		// Credit 16 GPU blocks + 0.75 × 16 CPU ones of 32 = 56 of 16: 8 to prefill.
		{name: "block 32, half on GPU, all on CPU", block: 32, match: index.Match{GPU: 16, CPU: 32, Other: 32, Spec: 32},
			want: -(8 + 64)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := eng("a")
			cs := []scheduler.Candidate{{Engine: &e, Match: tc.match, MatchBlock: tc.block}}
			var cyc scheduler.Cycle
			Dynamo{OverlapWeight: 1, HostWeight: 0.75}.Pick(req(64), cs, &cyc) // Active nil: decode = the request's 64 blocks
			if cs[0].Score != tc.want {
				t.Fatalf("score %v, want %v", cs[0].Score, tc.want)
			}
		})
	}
}
