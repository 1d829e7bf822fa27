package epp

import (
	"context"
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
	type req struct{ path, body string }
	var reqs []req
	for i := range 4 {
		reqs = append(reqs,
			req{"/v1/completions", completionsBody(rig.textA+fmt.Sprintf(" question %d", i), i%2 == 0)},
			req{"/v1/chat/completions", chatBody(rig.sysB, fmt.Sprintf("turn %d", i), i%2 == 1)},
			req{"/v1/completions", completionsBody(words(fmt.Sprintf("cold-%d", i), 120+40*i), false)},
			req{"/v1/chat/completions", chatBody(words(fmt.Sprintf("cold-system-%d", i), 90), "hello", false)},
		)
	}
	reqs = append(reqs, req{"/v1/completions", `{"model":"llama","prompt":[` + strings.Repeat("17,", 200) + `5],"max_tokens":2}`})
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
		if eppEngine != ingEngine {
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
// hold the same index and the same idle load view.
func waitSameView(t *testing.T, rig *pickerRig) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "both replicas settled on the same index and load view", func() bool {
		if !settled(rig.r) || !settled(rig.ing) {
			return false
		}
		var a, b []engineView
		if !getJSON("http://"+rig.r.ing.Addr()+"/debug/engines", &a) || !getJSON("http://"+rig.ing.ing.Addr()+"/debug/engines", &b) || len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i].ID != b[i].ID || a[i].KVUsage != b[i].KVUsage {
				return false
			}
			for _, tier := range []kvevents.Tier{kvevents.TierGPU, kvevents.TierCPU} {
				if rig.r.idx.KeyCount(a[i].ID, tier) != rig.ing.idx.KeyCount(a[i].ID, tier) {
					return false
				}
			}
		}
		return true
	})
}
