package sidecar

import (
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

var forms = []kvtest.EventForm{kvtest.ArrayForm, kvtest.MapForm}

// applyWire applies events to rank r of s as an engine sends them: encoded
// in form and decoded again. It returns apply's orphan report.
func applyWire(t *testing.T, s *state, r int, form kvtest.EventForm, events ...kvevents.Event) bool {
	t.Helper()
	payload := kvtest.AppendBatch(nil, &kvevents.Batch{TS: 1, DPRank: r, HasDPRank: true, Events: events}, form)
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(payload, &b); err != nil {
		t.Fatalf("%s form: %v", form, err)
	}
	return s.apply(b.DPRank, &b)
}

// On a hybrid model vLLM stores and removes a block's hash in every KV-cache
// group; kvmesh indexes the full-attention group only, so a removal of the
// sliding-window group must not drop the key the full-attention group still
// holds (tester h-dp F3).
func TestStateHybridGroupRemovalsKeepFullAttentionKeys(t *testing.T) {
	for _, form := range forms {
		t.Run(form.String(), func(t *testing.T) {
			s := newState("m", 4, 1)
			full := stored([]uint64{3001}, nil, toks(501, 4), "GPU")
			full.GroupIdx, full.HasGroupIdx, full.SpecKind = 0, true, "full_attention"
			sliding := full
			sliding.GroupIdx, sliding.SpecKind, sliding.SlidingWindow = 1, "sliding_window", 128
			rm := func(group int64) kvevents.Event {
				ev := removed("GPU", 3001)
				ev.GroupIdx, ev.HasGroupIdx = group, true
				return ev
			}
			// The sliding-window group's CPU location update names the group
			// by its index alone.
			loc := stored([]uint64{3001}, nil, nil, "CPU")
			loc.GroupIdx, loc.HasGroupIdx = 1, true
			applyWire(t, s, 0, form, full, sliding, loc)
			applyWire(t, s, 0, form, rm(1)) // the sliding window moves on
			if len(s.keyRefs[kvevents.TierGPU]) != 1 || len(s.keyRefs[kvevents.TierCPU]) != 0 || s.c.skippedGroups != 3 {
				t.Fatalf("after the sliding-window group's removal: %d keys (%d on CPU), %d skipped; want 1 (0), 3",
					len(s.keyRefs[kvevents.TierGPU]), len(s.keyRefs[kvevents.TierCPU]), s.c.skippedGroups)
			}
			applyWire(t, s, 0, form, rm(0))
			if len(s.keyRefs[kvevents.TierGPU]) != 0 || s.c.unknownRemoves != 0 {
				t.Fatalf("after the full-attention group's removal: %d keys, %d unknown removes; want 0, 0", len(s.keyRefs[kvevents.TierGPU]), s.c.unknownRemoves)
			}
		})
	}
}
