package ingress

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// The access log's blocks counts the prompt in the chosen engine's blocks,
// the unit of its matched_* fields: in a model of block sizes 16 and 32 a
// block-32 engine's full hit logged "blocks":64,"matched_gpu":32, half a
// prompt (tester h-reg8 F4).
func TestAccessLogBlocksInEngineBlocks(t *testing.T) {
	_, _, idx, mem, cfg := mixedBlockRig(t)
	var alog testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Membership: mem, Index: idx, AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})

	prompt := func(seed int) []uint32 {
		toks := make([]uint32, 1024)
		for i := range toks {
			toks[i] = uint32(1 + (i+seed)*37%30000)
		}
		return toks
	}
	held, other := prompt(0), prompt(5000)
	root := kvevents.Root("m", "", "")
	idx.Store("e32", kvevents.TierGPU, kvevents.AppendKeys(nil, root, held, 32))
	idx.Store("e16", kvevents.TierGPU, kvevents.AppendKeys(nil, root, other, 16))
	for i, want := range []struct {
		toks           []uint32
		engine         string
		blocks, gpuHit float64
	}{
		{held, "e32", 32, 32},  // e32 holds it: its 32 blocks of 32
		{other, "e16", 64, 64}, // e16 holds it: its 64 blocks of 16
	} {
		st, h, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenIDsBody(want.toks, 2))
		if st != 200 || h.Get("X-Kvmesh-Engine") != want.engine {
			t.Fatalf("request %d: %d from %q, want 200 from %s: %.300s", i, st, h.Get("X-Kvmesh-Engine"), want.engine, b)
		}
		testutil.WaitFor(t, 5*time.Second, "the access line", func() bool { return len(accessLines(t, &alog)) == i+1 })
		l := accessLines(t, &alog)[i]
		if l["engine"] != want.engine || l["blocks"] != want.blocks || l["matched_gpu"] != want.gpuHit {
			t.Errorf("request %d: engine %v blocks %v matched_gpu %v; want %s, %v, %v", i, l["engine"], l["blocks"], l["matched_gpu"],
				want.engine, want.blocks, want.gpuHit)
		}
	}
}
