package des

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/loadtest/report"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// Run simulates reqs once per policy (independently, each on fresh
// engines and a fresh index) and reports every policy's metrics plus the
// workload's oracle (infinite shared cache) hit rate. Policies run in
// parallel on cfg.Parallel goroutines; ctx cancels between policies.
func Run(ctx context.Context, cfg Config, reqs []workload.Request, policies []string) (report.Report, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return report.Report{}, err
	}
	var errs []error
	for _, p := range policies {
		if !slices.Contains(registry.PolicyNames(), p) || p == "weighted" && !cfg.Scheduler.HasParams("weighted") {
			errs = append(errs, fmt.Errorf("%w: unknown policy %q", ErrConfig, p))
		}
	}
	if len(policies) == 0 {
		errs = append(errs, fmt.Errorf("%w: no policies", ErrConfig))
	}
	if len(errs) > 0 {
		return report.Report{}, errors.Join(errs...)
	}
	rep := report.Report{Policies: make(map[string]report.PolicyResult, len(policies)), Order: policies,
		Runs: make(map[string]report.Run, len(policies))}
	type outcome struct {
		res report.PolicyResult
		run report.Run
	}
	err := eachPolicy(ctx, policies, cfg.Parallel, func(p string) (outcome, error) {
		s, err := newSim(&cfg, reqs, p)
		if err != nil {
			return outcome{}, err
		}
		st := s.run(ctx)
		o := outcome{st.result(), st.recs.run()}
		if s.learner != nil {
			o.res.Learned = learnedCosts(s.learner)
		}
		return o, nil
	}, func(p string, o outcome) { rep.Policies[p], rep.Runs[p] = o.res, o.run })
	if err != nil {
		return report.Report{}, err
	}
	rep.OracleHitRate = workload.OracleHitRate(reqs, cfg.Engine.BlockSize)
	return rep, nil
}
