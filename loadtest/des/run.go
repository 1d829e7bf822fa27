package des

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

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
	par := cfg.Parallel
	if par == 0 {
		par = runtime.GOMAXPROCS(0)
	}
	rep := report.Report{Policies: make(map[string]report.PolicyResult, len(policies)), Order: policies,
		Runs: make(map[string]report.Run, len(policies))}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		sem  = make(chan struct{}, par)
		ferr error
	)
	for _, p := range policies {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s, err := newSim(&cfg, reqs, p)
			var (
				res report.PolicyResult
				run report.Run
			)
			if err == nil {
				st := s.run(ctx)
				res, run = st.result(), st.recs.run()
				if s.learner != nil {
					l := s.learner.Pooled()
					res.Learned = report.LearnedCosts{PrefillRate: l.PrefillRate, StepBase: l.StepBase, DecodeSecPerToken: l.DecodeSecPerToken}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && ferr == nil {
				ferr = err
			}
			rep.Policies[p], rep.Runs[p] = res, run
		}()
	}
	wg.Wait()
	if ferr != nil {
		return report.Report{}, ferr
	}
	if err := ctx.Err(); err != nil {
		return report.Report{}, fmt.Errorf("des: %w", err)
	}
	rep.OracleHitRate = workload.OracleHitRate(reqs, cfg.Engine.BlockSize)
	return rep, nil
}
