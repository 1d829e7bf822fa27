package ingress

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// countingAdmitter admits every request and counts the slots released.
type countingAdmitter struct{ acquired, released atomic.Int64 }

func (a *countingAdmitter) Acquire(context.Context, string) (func(), error) {
	a.acquired.Add(1)
	return func() { a.released.Add(1) }, nil
}

// finishSpy is a scheduler counting the policy's done hook (policyDone).
type finishSpy struct {
	*scheduler.Scheduler
	finished atomic.Int64
}

func (f *finishSpy) Finished(engine string, keys []uint64) {
	f.finished.Add(1)
	f.Scheduler.Finished(engine, keys)
}

// A non-streamed answer held for a client that does not read it keeps its
// request in service (in flight, its MaxConcurrent slot), but the engine's
// side of the request ends as the engine's answer is handed over: the
// admission slot is released and the policy told the request is done while
// the request is still in flight. Before, both waited for the write to end
// (with sendTimeout 0, for the client's connection to close). The write
// then ends with the client: 499 in the access log, counted once.
func TestBufferedAnswerEndsEngineSideBeforeWrite(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultBigAnswer)
	cfg := testConfig(StaticEngine{ID: "big", Model: "m", URL: fe.url()})
	cfg.SendTimeout = 0       // the write waits for the client as long as its connection lives
	cfg.Health.StallAfter = 0 // a slow read of the answer on a loaded machine is no stall
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sch, err := scheduler.New(nil, policies.NewDynamo(), idx, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spy := &finishSpy{Scheduler: sch}
	adm := &countingAdmitter{}
	s := startIngress(t, cfg, Deps{Scheduler: spy, Index: idx, Admitter: adm, AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	conn := dialNoRead(t, s)
	sendRequest(t, conn, "/v1/completions", `{"model":"m","prompt":[1]}`)
	// A hang guard: reading the 16 MiB answer under the race detector on a
	// loaded machine takes seconds of CPU.
	testutil.WaitFor(t, 2*time.Minute, "the engine's side ended (admission released, the policy told)", func() bool {
		return adm.released.Load() == 1 && spy.finished.Load() == 1
	})
	// The 16 MiB answer cannot all be taken by a client that does not read:
	// the write is still blocked, so the request must still be in service.
	if n := s.inflight.Load(); n != 1 {
		t.Fatalf("in flight %d after the engine's side ended, want 1: the answer is not written yet", n)
	}
	if strings.Contains(alog.String(), `"msg":"request"`) {
		t.Fatalf("an access line before the answer was written: %s", alog.String())
	}
	conn.Close()
	testutil.WaitFor(t, 2*time.Minute, "the access line", func() bool { return strings.Contains(alog.String(), `"msg":"request"`) })
	l := accessLines(t, &alog)[0]
	if st, _ := l["status"].(float64); st != 499 {
		t.Fatalf("status %v, want 499: %v", l["status"], l)
	}
	waitSettled(t, s)
	if a, r, f := adm.acquired.Load(), adm.released.Load(), spy.finished.Load(); a != 1 || r != 1 || f != 1 {
		t.Fatalf("admission acquired %d released %d, policy told %d times; want 1 each", a, r, f)
	}
	if fe.hits.Load() != 1 {
		t.Fatalf("%d engine requests, want 1", fe.hits.Load())
	}
}
