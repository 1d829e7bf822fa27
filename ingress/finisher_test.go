package ingress

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/sim"
)

// activeSpy is the dynamo policy, recording how many blocks the picked
// engine had active right after each pick. Finished is Dynamo's.
type activeSpy struct {
	policies.Dynamo
	peak atomic.Int64
}

func (p *activeSpy) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	i, why := p.Dynamo.Pick(r, cs, cyc)
	p.peak.Store(int64(p.Active.Blocks(cs[i].ID)))
	return i, why
}

// A request the dynamo policy routed through the ingress releases its
// prompt blocks from the policy's active sequences when it finishes
// (streamed or not), so the decode term does not grow with every request
// ever routed.
func TestFinishedRequestReleasesDynamoBlocks(t *testing.T) {
	nt, tpl := llama(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 500, Tokenizer: nt, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pol := &activeSpy{Dynamo: policies.NewDynamo()}
	sch, err := scheduler.New(nil, pol, idx, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(StaticEngine{ID: "s", Model: "llama", URL: sm.URL()})
	s := startIngress(t, cfg, Deps{Tokenizers: TokenizerMap{"llama": tk}, Scheduler: sch, Index: idx, Logger: quiet})

	prompt := strings.Repeat("the router keeps a record of every prompt block it sends to a worker ", 8)
	for _, stream := range []bool{false, true} {
		pol.peak.Store(0)
		body := `{"model":"llama","max_tokens":3,"stream":` + map[bool]string{false: "false", true: "true"}[stream] +
			`,"prompt":` + string(mustJSON(t, prompt)) + `}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "s" {
			t.Fatalf("stream %v: status %d engine %q: %s", stream, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		if pol.peak.Load() == 0 {
			t.Fatalf("stream %v: the policy added no active blocks for a %d-character prompt", stream, len(prompt))
		}
		testutil.WaitFor(t, 10*time.Second, "the finished request's blocks to leave dynamo's active set", func() bool {
			return pol.Active.Blocks("s") == 0
		})
	}
}
