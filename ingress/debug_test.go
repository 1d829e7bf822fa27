package ingress

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestDebugConfigShowsSchedulerParams: /debug/config shows a scheduler
// plugin's block as its values, not as the yaml.Node it is kept in (whose
// JSON is the parser's Kind, Tag, Line, Column...).
func TestDebugConfigShowsSchedulerParams(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg, err := ParseConfig([]byte(`
scheduler:
  policy: kvmesh
  kvmesh:
    holdSeconds: 2
    holdAffinity: 0.5
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engines = []StaticEngine{{ID: "e1", Model: "m", URL: fe.url()}}
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminToken = "admin-secret"
	s := startIngress(t, cfg, Deps{})
	st, body := getAuth(t, "http://"+s.AdminAddr()+"/debug/config", "admin-secret")
	if st != http.StatusOK {
		t.Fatalf("/debug/config: %d %s", st, body)
	}
	var got struct {
		Config struct {
			Scheduler struct {
				Policy string
				Params map[string]map[string]any
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	sc := got.Config.Scheduler
	if sc.Policy != "kvmesh" || sc.Params["kvmesh"]["holdSeconds"] != 2.0 || sc.Params["kvmesh"]["holdAffinity"] != 0.5 {
		t.Errorf("scheduler shown as %+v, want policy kvmesh and kvmesh: {holdSeconds: 2, holdAffinity: 0.5}", sc)
	}
	for _, internal := range []string{`"LineComment"`, `"Column"`, `"Style"`} {
		if strings.Contains(body, internal) {
			t.Errorf("/debug/config shows yaml.Node's %s", internal)
		}
	}
}
