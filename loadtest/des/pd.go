package des

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// Roles is a P/D cluster's engine count per role.
type Roles struct {
	Prefill, Decode, Mixed int
}

// Total is the engine (GPU) count.
func (r Roles) Total() int { return r.Prefill + r.Decode + r.Mixed }

// String is the --roles form: prefill=N,decode=M,mixed=K.
func (r Roles) String() string {
	return fmt.Sprintf("prefill=%d,decode=%d,mixed=%d", r.Prefill, r.Decode, r.Mixed)
}

// ParseRoles parses "prefill=N,decode=M[,mixed=K]" (any order, each at most
// once, counts ≥ 0, at least one engine that can decode).
func ParseRoles(s string) (Roles, error) {
	var r Roles
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 || n > 4000 {
			return Roles{}, fmt.Errorf("%w: roles %q: want role=N with 0 ≤ N ≤ 4000, got %q", ErrConfig, s, part)
		}
		if seen[k] {
			return Roles{}, fmt.Errorf("%w: roles %q: %s given twice", ErrConfig, s, k)
		}
		seen[k] = true
		switch k {
		case "prefill":
			r.Prefill = n
		case "decode":
			r.Decode = n
		case "mixed":
			r.Mixed = n
		default:
			return Roles{}, fmt.Errorf("%w: roles %q: unknown role %q (prefill, decode, mixed)", ErrConfig, s, k)
		}
	}
	if r.Decode+r.Mixed == 0 {
		return Roles{}, fmt.Errorf("%w: roles %q: no engine can decode", ErrConfig, s)
	}
	return r, nil
}

// PDConfig configures a P/D benchmark run: Config's engines, client and
// router staleness, plus roles, the KV transfer and the SLOs.
type PDConfig struct {
	Config
	// Roles splits the engines; Config.Engines is ignored (Roles.Total()).
	Roles Roles
	// TransferGbps is prefill → decode KV bandwidth per transfer. Default 100.
	TransferGbps float64
	// TransferSetup is a transfer's fixed latency (side-channel handshake,
	// the prefill leg's response). Default 2ms.
	TransferSetup time.Duration
	// SLOTTFT and SLOTPOT define goodput: requests/s whose TTFT and mean
	// time per output token are both within them. Defaults 2s and 50ms.
	SLOTTFT, SLOTPOT time.Duration
	// NonCachedTokens is llm-d's decider threshold (0: its sample, 16).
	NonCachedTokens int
	// MixedPrefill lets kvmesh and kvmesh-always send prefill legs to
	// mixed engines (pd.Config.MixedPrefill); aggregated never splits.
	MixedPrefill bool
	// OutputDist has kvmesh and kvmesh-always price decode engines'
	// running streams' TPOT risk over the output lengths of finished
	// requests, weighted by their time at the engine (pd.Config.Outputs),
	// instead of at their mean, as the ingress does (`kvmesh bench`'s
	// --output-dist, on by default with --roles and --autoscale).
	OutputDist bool
}

// PDPolicies are the policies RunPD knows: "aggregated" (every engine
// mixed, kvmesh's aggregated cost model: the same GPUs without P/D) and
// scheduler/pd's names.
var PDPolicies = append([]string{"aggregated"}, pd.Names...)

// Defaults fills unset fields.
func (c *PDConfig) Defaults() {
	c.Engines = max(c.Roles.Total(), 1)
	c.Config.Defaults()
	if c.TransferGbps == 0 {
		c.TransferGbps = 100
	}
	if c.TransferSetup == 0 {
		c.TransferSetup = 2 * time.Millisecond
	}
	if c.SLOTTFT == 0 {
		c.SLOTTFT = 2 * time.Second
	}
	if c.SLOTPOT == 0 {
		c.SLOTPOT = 50 * time.Millisecond
	}
}

// Validate lists every problem.
func (c *PDConfig) Validate() error {
	errs := []error{c.Config.Validate()}
	if c.Roles.Decode+c.Roles.Mixed == 0 {
		errs = append(errs, fmt.Errorf("%w: roles %v: no engine can decode", ErrConfig, c.Roles))
	}
	if !(c.TransferGbps > 0) || math.IsInf(c.TransferGbps, 0) {
		errs = append(errs, fmt.Errorf("%w: transfer %v Gbit/s: want a finite value > 0", ErrConfig, c.TransferGbps))
	}
	if c.TransferSetup < 0 || c.SLOTTFT < 0 || c.SLOTPOT < 0 {
		errs = append(errs, fmt.Errorf("%w: transfer setup and SLOs must be ≥ 0", ErrConfig))
	}
	return errors.Join(errs...)
}

// MaxTransfer bounds one KV transfer: a config whose transfer of the
// workload's largest prompt takes longer is refused (CheckTransfers). A
// day is far past any real link (a 7B model's 128k-token prompt, 7.3 GB,
// takes 0.6 s at 100 Gbit/s); a bandwidth this low is most likely a unit
// mistake (bit/s or Mbit/s for Gbit/s), and one past ~292 years overflowed
// the transfer's time.Duration into negative TTFTs.
const MaxTransfer = 24 * time.Hour

// transferSeconds is how long moving bytes of KV takes, in seconds: the
// setup plus the bytes at TransferGbps.
func (c *PDConfig) transferSeconds(bytes float64) float64 {
	return c.TransferSetup.Seconds() + bytes*8/(c.TransferGbps*1e9)
}

// transferTime is transferSeconds as a time.Duration, for a transfer
// CheckTransfers has bounded; a longer one (a run that skipped the check)
// takes MaxTransfer rather than wrapping to a negative time.
func (c *PDConfig) transferTime(bytes float64) time.Duration {
	if !(c.transferSeconds(bytes) <= MaxTransfer.Seconds()) {
		return MaxTransfer
	}
	return c.TransferSetup + time.Duration(bytes*8/(c.TransferGbps*1e9)*float64(time.Second))
}

// CheckTransfers refuses c (after Defaults) when moving the KV of reqs'
// largest prompt — the largest transfer the run can make — takes longer
// than MaxTransfer.
func (c *PDConfig) CheckTransfers(reqs []workload.Request) error {
	n := 0
	for i := range reqs {
		n = max(n, reqs[i].PromptTokens)
	}
	bytes := float64(n) * c.Engine.Profile.KVBytesPerToken
	if s := c.transferSeconds(bytes); !(s <= MaxTransfer.Seconds()) {
		return fmt.Errorf("%w: transfer %g Gbit/s with %v setup: the largest prompt's KV (%d tokens, %.3g GB) would take %.3g s (%.3g days), over %v: a unit mistake? (the bandwidth is in Gbit/s)",
			ErrConfig, c.TransferGbps, c.TransferSetup, n, bytes/1e9, s, s/86400, MaxTransfer)
	}
	return nil
}

// pdPolicy builds the P/D policy for a run.
// kvmesh's (and aggregated's) cost model is costs, the run's learner (nil:
// the configured rates, FixedCosts).
// outs, when not nil, is the output-length distribution kvmesh prices over.
func (c *PDConfig) pdPolicy(name string, costs policies.CostModel, outs *pd.OutputDist) (pd.Policy, error) {
	cost, err := pd.CostFrom(c.Scheduler)
	if err != nil {
		return nil, err
	}
	pc := pd.Config{Policy: name, Cost: cost, KVBytesPerToken: c.Engine.Profile.KVBytesPerToken,
		TransferGbps: c.TransferGbps, TransferSetup: c.TransferSetup.Seconds(), NonCachedTokens: c.NonCachedTokens,
		SLOTTFT: c.SLOTTFT.Seconds(), SLOTPOT: c.SLOTPOT.Seconds(), Costs: costs}
	if name == "aggregated" {
		pc.Policy = "kvmesh"
	} else {
		pc.MixedPrefill, pc.Outputs = c.MixedPrefill, outs
	}
	if pc.TransferSetup == 0 {
		pc.TransferSetup = -1 // pd.Config reads 0 as its default
	}
	return pd.New(pc)
}

// RunPD simulates reqs once per P/D policy on the same roles (aggregated:
// the same engines, all mixed) and reports goodput under the SLOs and
// TTFT/TPOT percentiles. Policies run in parallel on cfg.Parallel
// goroutines.
func RunPD(ctx context.Context, cfg PDConfig, reqs []workload.Request, policies []string) (PDReport, error) {
	cfg.Defaults()
	err := cfg.Validate()
	if err == nil {
		err = cfg.CheckTransfers(reqs)
	}
	errs := []error{err}
	for _, p := range policies {
		if !slices.Contains(PDPolicies, p) {
			errs = append(errs, fmt.Errorf("%w: unknown P/D policy %q (known: %s)", ErrConfig, p, strings.Join(PDPolicies, ", ")))
		}
	}
	if len(policies) == 0 {
		errs = append(errs, fmt.Errorf("%w: no policies", ErrConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return PDReport{}, err
	}
	rep := PDReport{Policies: make(map[string]PDResult, len(policies)), Order: policies, Roles: cfg.Roles,
		SLOTTFT: cfg.SLOTTFT.Seconds(), SLOTPOT: cfg.SLOTPOT.Seconds(),
		Runs: make(map[string]report.Run, len(policies))}
	type outcome struct {
		res PDResult
		run report.Run
	}
	err = eachPolicy(ctx, policies, cfg.Parallel, func(p string) (outcome, error) {
		s, err := newPDSim(&cfg, reqs, p)
		if err != nil {
			return outcome{}, err
		}
		o := outcome{res: s.run(ctx)}
		o.run, o.res.LoadImbalance = s.records()
		return o, nil
	}, func(p string, o outcome) { rep.Policies[p], rep.Runs[p] = o.res, o.run })
	if err != nil {
		return PDReport{}, err
	}
	return rep, nil
}
