package orchestrator

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// generations holds, per object (the ModelDeployments: stale; the
// RoleScalers: ours, forget), the generation the controller's own spec write
// produced, until the informer cache shows it. A reconcile
// that reads an older generation waits for the cache instead of acting on
// it: otherwise a RoleScaler scaled by a user, copied into the deployment,
// could be copied back from the deployment's stale cached replicas (the
// scaler's status event can arrive before the deployment's), undoing the
// user's scale. Kubernetes' own controllers keep expectations for the same
// reason.
type generations struct {
	mu sync.Mutex
	m  map[types.UID]int64
}

// expect records that uid's spec was written and is now at generation gen.
func (g *generations) expect(uid types.UID, gen int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[types.UID]int64{}
	}
	g.m[uid] = max(g.m[uid], gen)
}

// stale reports whether a cached object of uid at generation gen predates
// the controller's last write; once the cache has caught up the
// expectation is dropped.
func (g *generations) stale(uid types.UID, gen int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	want, ok := g.m[uid]
	if !ok {
		return false
	}
	if gen >= want {
		delete(g.m, uid)
		return false
	}
	return true
}

// ours reports whether uid's cached generation gen is the one the
// controller's own last spec write produced (the RoleScalers'
// generations: a scaler at it was not scaled by anyone else).
func (g *generations) ours(uid types.UID, gen int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	w, ok := g.m[uid]
	return ok && w == gen
}

// forget drops uid's record once the cache shows a status that observed
// generation gen, the recorded one or a later one.
func (g *generations) forget(uid types.UID, gen int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w, ok := g.m[uid]; ok && gen >= w {
		delete(g.m, uid)
	}
}
