package ingress

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/scheduler"
)

// TestEjectedGaugeLeavesDepartedEngines: kvmesh_ingress_engines_ejected
// counts an ejected engine while it is in membership, not once it has left
// (its record, still ejected, stays for the forget grace: tester h-scale
// read 11 ejected engines with every engine in membership healthy); one
// back within the grace is still ejected and counted again.
func TestEjectedGaugeLeavesDepartedEngines(t *testing.T) {
	const gauge = "kvmesh_ingress_engines_ejected"
	fe := startFaultEngine(t, faultOK)
	fe.close()
	good := startFaultEngine(t, faultOK)
	deadInfo := EngineInfo{Engine: scheduler.Engine{ID: "dead", Model: "m", Healthy: true}, URL: fe.url()}
	goodInfo := EngineInfo{Engine: scheduler.Engine{ID: "good", Model: "m", Healthy: true}, URL: good.url()}
	mem := &churnMembership{}
	mem.set(deadInfo)
	reg := prometheus.NewRegistry()
	s := startIngress(t, sweepConfig(), Deps{Membership: mem, Registry: reg})
	clk := &testClock{t: time.Now()}
	s.ups.departed.setClock(clk.now, time.Hour, time.Second)
	s.forgetDeparted()
	if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`); st != 503 {
		t.Fatalf("%d %s, want 503 from the dead engine", st, b)
	}
	if got := gaugeValue(t, reg, gauge); got != 1 {
		t.Fatalf("%s %v after the dead engine's connect error, want 1", gauge, got)
	}
	mem.set(goodInfo) // the dead engine's sidecar left gossip
	clk.add(time.Minute)
	s.forgetDeparted()
	if ej := s.health.ejected(); len(ej) != 1 || ej[0] != "dead" {
		t.Fatalf("ejected records %v, want the dead engine's kept for the grace", ej)
	}
	if got := gaugeValue(t, reg, gauge); got != 0 {
		t.Fatalf("%s %v with the ejected engine gone from membership, want 0", gauge, got)
	}
	mem.set(goodInfo, deadInfo) // back within the grace (a gossip flap): still ejected
	clk.add(time.Minute)
	s.forgetDeparted()
	if got := gaugeValue(t, reg, gauge); got != 1 {
		t.Fatalf("%s %v with the ejected engine back in membership, want 1", gauge, got)
	}
}
