package ingress

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An ingress runs with a NATS user that may only subscribe to the deltas and
// request snapshots: it never creates or alters the JetStream stream, whose
// retention the sidecars (or the orchestrator) set.
func TestIngressRunsWithoutStreamAdminRights(t *testing.T) {
	reader := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"kvmesh.snap.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"kvmesh.delta.>", "_INBOX.>"}},
	}
	srv := testutil.NATSServer(t, server.Options{JetStream: true,
		Users: []*server.User{{Username: "admin", Password: "admin-pw"}, {Username: "ingress", Password: "ingress-pw", Permissions: reader}}})
	ctx := context.Background()

	// The stream as a sidecar made it, with its own retention.
	admin := natsutil.DefaultConfig()
	admin.URLs, admin.User, admin.Password = []string{srv.ClientURL()}, "admin", "admin-pw"
	admin.Stream.MaxAge = time.Hour
	ac, err := natsutil.Connect(ctx, admin, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()

	// The permissions do bite: managing the stream as "ingress" fails.
	bad := natsutil.DefaultConfig()
	bad.URLs, bad.User, bad.Password = []string{srv.ClientURL()}, "ingress", "ingress-pw"
	bad.ConnectTimeout = time.Second
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if c, err := natsutil.Connect(sctx, bad, quietLog()); err == nil {
		c.Close()
		t.Fatal("the restricted user could manage the stream; the test proves nothing")
	}

	cfg := testConfig()
	cfg.Cluster.NATSURLs = []string{srv.ClientURL()}
	cfg.Cluster.NATSAuth = natsutil.Auth{User: "ingress", Password: "ingress-pw"}
	s := startIngress(t, cfg, Deps{})
	testutil.WaitFor(t, 10*time.Second, "the ingress's NATS connection", func() bool {
		return s.cl.nc != nil && s.cl.nc.NC.Status() == nats.CONNECTED
	})
	st, err := ac.JS.Stream(ctx, natsutil.Default().Stream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != time.Hour {
		t.Fatalf("stream max age %v after the ingress started, want the sidecar's 1h", info.Config.MaxAge)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A NATS user allowed to publish on the state lane but not to subscribe to
// it (an upgrade applied halfway): NATS refuses the subscription
// asynchronously, and the ingress says the lane is off, as it does for a
// refused publish, instead of one generic async-error line.
func TestIngressSaysWhenTheLaneSubscriptionIsRefused(t *testing.T) {
	half := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"kvmesh.snap.>", "kvmesh.state.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"kvmesh.delta.>", "_INBOX.>"}},
	}
	_, buf, _ := laneIngress(t, half)
	testutil.WaitFor(t, 15*time.Second, "the refused subscription logged", func() bool {
		return strings.Contains(buf.String(), "state lane off: the NATS user may not subscribe to kvmesh.state.>")
	})
}

// A NATS user whose permissions predate the lane altogether (neither
// subscribe nor publish on kvmesh.state.>): both refusals are said once,
// and the publisher stops instead of drawing a NATS error per publish, even
// though the subscription's watch ended first.
func TestIngressSaysWhenTheLaneIsRefusedBothWays(t *testing.T) {
	old := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"kvmesh.snap.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"kvmesh.delta.>", "_INBOX.>"}},
	}
	s, buf, reg := laneIngress(t, old)
	testutil.WaitFor(t, 15*time.Second, "the refused subscription logged", func() bool {
		return strings.Contains(buf.String(), "state lane off: the NATS user may not subscribe to kvmesh.state.>")
	})
	published := func() float64 { return metricOf(t, reg, "kvmesh_gossip_nats_published_total").GetCounter().GetValue() }
	publishing := func() bool { return gaugeValue(t, reg, "kvmesh_gossip_nats_publishing") == 1 }
	// Own entries change (what the gossip node relays on each change)
	// until the publisher gives up; bounded.
	for i := 0; !strings.Contains(buf.String(), "state lane off: the NATS user may not publish on kvmesh.state.>"); i++ {
		if i > 1000 {
			t.Fatal("the publisher never said the lane's publishes are refused")
		}
		before := published()
		s.cl.lane.pub.Relay("me", "k", []byte{byte(i)})
		testutil.WaitFor(t, 10*time.Second, "the entry handed to NATS", func() bool {
			return published() > before || !publishing()
		})
		if err := s.cl.nc.NC.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the publisher stopped", func() bool { return !publishing() })
	if n := strings.Count(buf.String(), "may not publish on kvmesh.state.>"); n != 1 {
		t.Fatalf("the publish refusal logged %d times, want once", n)
	}
}

// laneIngress is an ingress with gossip and the state lane, connected to a
// NATS server as a user with perms; it returns its log and metrics too.
func laneIngress(t *testing.T, perms *server.Permissions) (*Server, *testutil.SyncBuffer, *prometheus.Registry) {
	t.Helper()
	srv := testutil.NATSServer(t, server.Options{Users: []*server.User{{Username: "ingress", Password: "ingress-pw", Permissions: perms}}})
	log, buf := syncLog()
	cfg := testConfig()
	cfg.Cluster.GossipBind, cfg.Cluster.GossipProfile = "127.0.0.1:0", "local"
	cfg.Cluster.NATSURLs = []string{srv.ClientURL()}
	cfg.Cluster.NATSAuth = natsutil.Auth{User: "ingress", Password: "ingress-pw"}
	reg := prometheus.NewRegistry()
	return startIngress(t, cfg, Deps{Logger: log, Registry: reg}), buf, reg
}
