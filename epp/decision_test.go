package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// TestSameDecisionAsIngress sends the same requests, one at a time, to the
// picker (through the Envoy stand-in) and to a plain kvmesh ingress replica
// in the same mesh, each with its own index fed from NATS, and checks that
// both choose the same engine: requests cached on one engine or the other,
// chat and completions, and cold prompts decided on load. Between requests
// both replicas are let settle to the same view (index, gossiped load), so
// a difference can only come from the decision itself.
func TestSameDecisionAsIngress(t *testing.T) {
	rig := newPickerRig(t)
	m := rig.m
	env := newEnvoy(t, rig.s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	// cold marks prompts no engine holds: they are decided on load, and
	// load includes each replica's own in-flight bookkeeping, which gossip
	// shares only every load interval, so two replicas may rightly differ on
	// them. They stay in the sequence (they change what the engines hold);
	// their decisions are counted, not compared.
	type req struct {
		path, body string
		cold       bool
	}
	var reqs []req
	for i := range 4 {
		reqs = append(reqs,
			req{"/v1/completions", completionsBody(rig.textA+fmt.Sprintf(" question %d", i), i%2 == 0), false},
			req{"/v1/chat/completions", chatBody(rig.sysB, fmt.Sprintf("turn %d", i), i%2 == 1), false},
			req{"/v1/completions", completionsBody(words(fmt.Sprintf("cold-%d", i), 120+40*i), false), true},
			req{"/v1/chat/completions", chatBody(words(fmt.Sprintf("cold-system-%d", i), 90), "hello", false), true},
		)
	}
	reqs = append(reqs, req{"/v1/completions", `{"model":"llama","prompt":[` + strings.Repeat("17,", 200) + `5],"max_tokens":2}`, true})
	picked := map[string]int{}
	for i, r := range reqs {
		waitSameView(t, rig)
		res, err := env.do(context.Background(), httpRequest{method: "POST", path: r.path, body: []byte(r.body)}, false)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		first, _, _ := strings.Cut(res.dest, ",")
		eppEngine := m.eng[first]
		resp, err := http.Post("http://"+rig.ing.ing.Addr()+r.path, "application/json", strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		ingEngine := resp.Header.Get("X-Kvmesh-Engine")
		if resp.StatusCode != 200 || ingEngine == "" {
			t.Fatalf("request %d: ingress answered %d (engine %q)", i, resp.StatusCode, ingEngine)
		}
		if eppEngine != ingEngine && !r.cold {
			t.Fatalf("request %d (%s): picker chose %s (%s), ingress %s", i, r.path, eppEngine, res.dest, ingEngine)
		}
		picked[eppEngine]++
	}
	// The set is not trivially one-sided: both engines were chosen.
	if picked["eng-a"] == 0 || picked["eng-b"] == 0 {
		t.Fatalf("decisions %v: every request went to one engine", picked)
	}
}

// waitSameView waits until the picker's replica and the ingress replica
// hold the same index and the same idle engine view (every field gossip
// carries), unchanged over three consecutive polls.
func waitSameView(t *testing.T, rig *pickerRig) {
	t.Helper()
	var last string
	stable := 0
	testutil.WaitFor(t, 20*time.Second, "both replicas settled on the same index and engine view", func() bool {
		v, ok := sameView(rig)
		if !ok {
			stable, last = 0, ""
			return false
		}
		if v == last {
			stable++
		} else {
			stable, last = 1, v
		}
		return stable >= 3
	})
}

// sameView returns the shared view when both replicas agree on it.
func sameView(rig *pickerRig) (string, bool) {
	if !settled(rig.r) || !settled(rig.ing) {
		return "", false
	}
	a, okA := engineFields(rig.r)
	b, okB := engineFields(rig.ing)
	if !okA || !okB || a != b {
		return "", false
	}
	var counts []int
	for _, id := range []string{"eng-a", "eng-b"} {
		for _, tier := range []kvevents.Tier{kvevents.TierGPU, kvevents.TierCPU} {
			n := rig.r.idx.KeyCount(id, tier)
			if n != rig.ing.idx.KeyCount(id, tier) {
				return "", false
			}
			counts = append(counts, n)
		}
	}
	return fmt.Sprint(a, counts), true
}

// engineFields is a replica's /debug/engines without its own bookkeeping
// (local in-flight, request and failure counters), as canonical JSON.
func engineFields(r *replica) (string, bool) {
	var list []map[string]any
	if !getJSON("http://"+r.ing.AdminAddr()+"/debug/engines", &list) {
		return "", false
	}
	for _, e := range list {
		delete(e, "local_inflight")
		delete(e, "requests")
		delete(e, "failures")
		delete(e, "recent_ttft_s") // per replica: its own answers' latencies
		delete(e, "recent_tpot_s")
		delete(e, "learned") // per replica (off in these tests)
		// The scheduler-side load /debug/engines adds (addLocalLoad): this
		// replica's own latencies and token charges.
		delete(e, "TTFT")
		delete(e, "TPOT")
		delete(e, "LocalPrefillTokens")
		delete(e, "LocalActiveTokens")
	}
	b, err := json.Marshal(list)
	return string(b), err == nil
}
