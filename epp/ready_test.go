package epp

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/scheduler"
)

// fakeSidecarMembership is a FAKE of the mesh's membership (what the
// sidecars gossip): two engines of the model whose health the test sets,
// none until listed is set.
type fakeSidecarMembership struct {
	listed  atomic.Bool
	healthy atomic.Bool
}

func (f *fakeSidecarMembership) Engines(dst []ingress.EngineInfo) []ingress.EngineInfo {
	if !f.listed.Load() {
		return dst
	}
	for _, e := range twoEngines {
		dst = append(dst, ingress.EngineInfo{Engine: scheduler.Engine{ID: e[0], Model: model, Healthy: f.healthy.Load()}, URL: e[1]})
	}
	return dst
}

// TestReadyWithEveryEngineDown: readiness is GAIE's ("can decide": index
// synced, engines known), not "an engine is healthy". With every engine of
// the mesh known but unhealthy the picker stays SERVING and answers the
// protocol's 503 with Retry-After itself; were it NOT_SERVING, every
// replica would leave the Service at once and the gateway would answer
// its own error instead. Before any engine is known it is NOT_SERVING.
func TestReadyWithEveryEngineDown(t *testing.T) {
	mem := &fakeSidecarMembership{}
	r := newStaticRigWith(t, nil, Config{}, Deps{}, nil, func(d *ingress.Deps) { d.Membership = mem })
	conn, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ready := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r.s.updateReady() // what readyLoop runs every ReadyInterval
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	if st := ready(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("no engine known: readiness %v, want NOT_SERVING", st)
	}
	mem.listed.Store(true) // known, every one down
	if st := ready(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("every engine known and down: readiness %v, want SERVING", st)
	}
	ir := r.open(t, fd).headers("/v1/chat/completions", false).body([]byte(chatBody("sys", "hi", false)), true).refused(503, "service_unavailable")
	if immediateHeader(ir, "retry-after") == "" {
		t.Fatalf("503 without Retry-After: %v", ir)
	}
	mem.healthy.Store(true)
	s := r.open(t, fd).headers("/v1/chat/completions", false).body([]byte(chatBody("sys", "hi", false)), true)
	routed(t, s.recv())
	s.recv()
	s.end()
	if st := ready(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("engines up: readiness %v", st)
	}
}
