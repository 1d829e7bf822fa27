package pd

import (
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/scorers"
)

// policiesQueue is llm-d's queue-scorer (min-max normalised waiting).
func policiesQueue(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	scorers.Queue{}.Score(r, cs, out)
}
