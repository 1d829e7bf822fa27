package epp

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestDrainDelay: Close turns readiness NOT_SERVING (liveness stays SERVING,
// and the HTTP /ready says draining) and keeps serving for
// Config.DrainDelay before it stops taking streams: until the gateway
// learns the pod is leaving it still sends here, and a refused connection
// fails the request under FailClose. The delay ends at its time or at
// Close's context (cancelled here instead of waiting an hour).
func TestDrainDelay(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{DrainDelay: time.Hour}, Deps{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	closed := make(chan struct{})
	go func() { r.s.Close(ctx); close(closed) }()
	defer func() {
		cancel()
		<-closed
	}()

	conn, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	testutil.WaitFor(t, 10*time.Second, "readiness NOT_SERVING while draining", func() bool {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: HealthReadiness})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	// The process answers: a liveness probe during a long delay must not
	// have the pod restarted.
	if resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: HealthLiveness}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness while draining: %v %v, want SERVING", resp, err)
	}
	hr, err := http.Get("http://" + r.s.ing.Addr() + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	var ready struct{ Draining, Ready bool }
	err = json.NewDecoder(hr.Body).Decode(&ready)
	hr.Body.Close()
	if err != nil || hr.StatusCode != 503 || !ready.Draining || ready.Ready {
		t.Fatalf("HTTP /ready while draining: %d %+v %v, want 503, draining", hr.StatusCode, ready, err)
	}
	// A new connection and a new stream while draining are served.
	s := r.open(t, fd).headers("/v1/chat/completions", false).body([]byte(chatBody("sys", "hi", false)), true)
	routed(t, s.recv())
	s.recv()
	s.end()

	cancel()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return once its context ended")
	}
	plain, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(plain).Check(cctx, &healthpb.HealthCheckRequest{Service: HealthLiveness}); err == nil {
		t.Fatal("still serving after Close")
	}
}
