package orchestrator

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// podGate holds every pod creation while closed, as a client at its rate
// limit holds a large deployment's: entered is closed once one waits.
type podGate struct {
	rt      http.RoundTripper
	mu      sync.Mutex
	closed  bool
	open    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func newPodGate() *podGate { return &podGate{open: make(chan struct{}), entered: make(chan struct{})} }

func (g *podGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func (g *podGate) release() { close(g.open) }

func (g *podGate) RoundTrip(req *http.Request) (*http.Response, error) {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed && req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/pods") {
		g.once.Do(func() { close(g.entered) })
		select {
		case <-g.open:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return g.rt.RoundTrip(req)
}

// TestStatusProgressingDuringCreation: a step that creates pods (minutes
// for a large deployment at the client's rate limit) says so on the status
// as it starts: the new generation observed, Progressing True. The status
// stayed at the previous generation, Progressing False (Complete) and its
// group count, until the whole step ended (tester h-k8sf).
func TestStatusProgressingDuringCreation(t *testing.T) {
	e := newEnv(t)
	gate := newPodGate()
	cfg := rest.CopyConfig(e.srv.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { gate.rt = rt; return gate })
	e.startController(t, cfg)
	if err := e.applyDoc(t, twoDoc); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "two"}
	testutil.WaitFor(t, wait, "2 pods, status Complete at the generation", func() bool {
		md := e.md(t, "two")
		p := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionProgressing)
		return len(e.pods(t, sel)) == 2 && md.Status.ObservedGeneration == md.Generation &&
			p != nil && p.Status == metav1.ConditionFalse && p.Reason == "Complete"
	})

	gate.close()
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	if _, err := mdc.Patch(e.ctx, "two", types.MergePatchType, []byte(`{"spec":{"groups":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gate.entered:
	case <-e.ctx.Done():
		t.Fatal("no pod creation began")
	}
	// The step is held in its first creation: what the status says now is
	// what it says for the whole of a long one.
	md := e.md(t, "two")
	p := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionProgressing)
	if md.Status.ObservedGeneration != md.Generation || p == nil || p.Status != metav1.ConditionTrue || p.ObservedGeneration != md.Generation {
		t.Errorf("during the creation step: generation %d, observed %d, Progressing %+v; want observed %d, Progressing True",
			md.Generation, md.Status.ObservedGeneration, p, md.Generation)
	}
	if md.Status.Groups != 1 || md.Status.Ready != "0/3" {
		t.Errorf("during the creation step: groups %d, ready %q; want 1 (as they are) and 0/3", md.Status.Groups, md.Status.Ready)
	}
	if g := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionGangBlocked); g == nil || g.Status != metav1.ConditionFalse {
		t.Errorf("during the creation step: GangBlocked %+v, want as it was (False)", g)
	}

	gate.release()
	testutil.WaitFor(t, wait, "6 pods, status Complete with 3 groups", func() bool {
		md := e.md(t, "two")
		p := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionProgressing)
		return len(e.pods(t, sel)) == 6 && md.Status.ObservedGeneration == md.Generation && md.Status.Groups == 3 &&
			p != nil && p.Status == metav1.ConditionFalse && p.Reason == "Complete"
	})
}

// steadyFrom returns a snapshot of cnt taken once ctrl's cache shows the
// deployment as the API server has it and two more passes (reads of the
// held pod's name) followed: a pass that read an older copy, whose status
// write the API server refuses (409) but cnt counts, has ended by then.
func (e *env) steadyFrom(t *testing.T, ctrl *Controller, cnt *requestCounter, name, heldPod string) *requestCounter {
	t.Helper()
	testutil.WaitFor(t, wait, "the cache to show deployment "+name+" as the API server has it", func() bool {
		o, err := ctrl.mds.ByNamespace(e.ns).Get(name)
		return err == nil && o.(metav1.Object).GetResourceVersion() == e.md(t, name).ResourceVersion
	})
	from := cnt.count("GET", "/pods/"+heldPod)
	testutil.WaitFor(t, wait, "two more passes", func() bool { return cnt.count("GET", "/pods/"+heldPod) >= from+2 })
	return cnt.snapshot()
}
