package ingress

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
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

// /debug/index shows how the materializer follows each engine: an engine
// whose snapshots fail (here its sidecar answers every snapshot request
// with an error) is listed with its snapshot_failures, as
// docs/OPERATIONS.md tells operators to look for.
func TestDebugIndexShowsSnapshotFailures(t *testing.T) {
	ns := testutil.NATS(t)
	side, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(side.Close)
	var asked atomic.Int64
	sub, err := side.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(msg *nats.Msg) {
		asked.Add(1)
		r := nats.NewMsg(msg.Reply)
		r.Header.Set(kvevents.SnapshotErrorHeader, "the sidecar cannot read its engine")
		_ = msg.RespondMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := side.Flush(); err != nil {
		t.Fatal(err)
	}

	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Cluster = ClusterConfig{NATSURLs: []string{ns.URL()}}
	s := startIngress(t, cfg, Deps{})
	testutil.WaitFor(t, 10*time.Second, "the materializer subscribed", func() bool { return s.cl.mat.Synced() })
	d := kvevents.Delta{Engine: "e1", Model: "m", Epoch: 7, Seq: 1, TS: time.Now().UnixNano(), EpochStart: time.Now().Add(-time.Minute).UnixNano(),
		Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{1, 2}}}}
	if err := side.Publish(natsutil.Default().DeltaSubject("m", "e1"), kvevents.AppendDelta(nil, &d)); err != nil {
		t.Fatal(err)
	}
	type engine struct {
		Engine           string `json:"engine"`
		Model            string `json:"model"`
		Synced           *bool  `json:"synced"`
		Buffered         *int   `json:"buffered"`
		Snapshotting     *bool  `json:"snapshotting"`
		SnapshotFailures int    `json:"snapshot_failures"`
	}
	var got struct {
		Materializer []engine `json:"materializer"`
	}
	var body string
	testutil.WaitFor(t, 20*time.Second, "/debug/index to show e1's failed snapshot", func() bool {
		var st int
		st, body, _ = get("http://" + s.AdminAddr() + "/debug/index")
		if st != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil {
			t.Fatalf("/debug/index: %d %s", st, body)
		}
		return len(got.Materializer) == 1 && got.Materializer[0].SnapshotFailures > 0
	})
	e := got.Materializer[0]
	// Its delta waits behind the snapshot that keeps failing.
	if e.Engine != "e1" || e.Model != "m" || e.Synced == nil || *e.Synced || e.Buffered == nil || *e.Buffered != 1 || e.Snapshotting == nil || asked.Load() == 0 {
		t.Fatalf("/debug/index's materializer entry %+v (%d snapshot requests): %s", e, asked.Load(), body)
	}
}

// TestDebugConfigGossipKeysRedacted: /debug/config shows each gossip key as
// the text "redacted", as docs/SECURITY.md says, not as the base64 of it
// ("cmVkYWN0ZWQ=", which reads as a real key), and never the key.
func TestDebugConfigGossipKeysRedacted(t *testing.T) {
	cfg := DefaultConfig()
	key, extra := []byte("0123456789abcdef"), []byte("fedcba9876543210")
	cfg.Cluster.GossipKey, cfg.Cluster.GossipKeys = key, [][]byte{extra}
	b, err := json.Marshal(showConfig(redactConfig(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Config struct {
			Cluster struct {
				GossipKey  string
				GossipKeys []string
			}
		}
	}
	if err := json.Unmarshal(b, &got.Config); err != nil {
		t.Fatal(err)
	}
	if c := got.Config.Cluster; c.GossipKey != natsutil.Redacted || len(c.GossipKeys) != 1 || c.GossipKeys[0] != natsutil.Redacted {
		t.Errorf("gossip keys shown as %q, %q; want %q", c.GossipKey, c.GossipKeys, natsutil.Redacted)
	}
	for _, leak := range []string{"cmVkYWN0ZWQ", "0123456789abcdef", "MDEyMzQ1Njc4OWFiY2RlZg", "fedcba9876543210"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("/debug/config shows %s: %s", leak, b)
		}
	}
	cfg.Cluster.GossipKey, cfg.Cluster.GossipKeys = nil, nil // no keys: none shown
	b, _ = json.Marshal(showConfig(redactConfig(cfg)))
	if strings.Contains(string(b), natsutil.Redacted) {
		t.Errorf("no gossip key, but %s", b)
	}
}
