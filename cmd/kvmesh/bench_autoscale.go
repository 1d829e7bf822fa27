package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/bench"
	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// autoscaleFlags are `kvmesh bench --mode des --autoscale ...`'s options:
// a P/D cluster resized at run time by static, kvmesh's SLO mode or an
// emulation of Kthena's autoscaler, on a diurnal or bursty trace.
type autoscaleFlags struct {
	autoscale    *string
	shape        *string
	startup      *time.Duration
	sync         *time.Duration
	initial      *string
	maxPerRole   *int
	ratio        *string
	sloUtil      *string
	sloStable    *time.Duration
	sloCooldown  *time.Duration
	sloCorrWin   *time.Duration
	sloLearned   *bool
	sloExpect    *float64
	sloTPOTExp   *float64
	sloRaise     *bool
	sloLead      *time.Duration
	sloTrend     *time.Duration
	sloBaseline  *time.Duration
	sloAggregate *float64
	kthena       *string
	capTable     *string
	capHeadroom  *string
	duration     *time.Duration
	peak, trough *float64
	base, burst  *float64
	prefixTokens *int
	ownTokens    *int
	outTokens    *int
}

func autoscaleBenchFlags(fs *flag.FlagSet) autoscaleFlags {
	return autoscaleFlags{
		autoscale:    fs.String("autoscale", "", "autoscaling P/D run: comma-separated static, slo, kthena, capacity, clairvoyant (static runs at --roles; the others start at --initial-roles; capacity and clairvoyant are analysis references, not controllers)"),
		capTable:     fs.String("capacity-table", "1/1=2.67,2/1=5.39,2/2=6.48,3/2=9.52,4/2=11.11,4/3=13.36", "with --autoscale capacity or clairvoyant: P/D=req/s each split keeps the SLOs at (docs/BENCHMARKS.md, stop 49's capacities within the 1:4 band)"),
		capHeadroom:  fs.String("capacity-headroom", "0", "with --autoscale capacity or clairvoyant: comma-separated headrooms h (one run each): size for (1+h) × the rate"),
		shape:        fs.String("shape", "diurnal", "with --autoscale: trace shape, diurnal or bursty"),
		startup:      fs.Duration("startup-delay", 60*time.Second, "with --autoscale: engine start-up delay (GPU time counts from the request)"),
		sync:         fs.Duration("sync-period", 15*time.Second, "with --autoscale: autoscaler sync period"),
		initial:      fs.String("initial-roles", "prefill=2,decode=2", "with --autoscale: starting size of slo and kthena runs"),
		maxPerRole:   fs.Int("max-per-role", 32, "with --autoscale: engines per role at most"),
		ratio:        fs.String("ratio", "0.25:2", "with --autoscale: prefill/decode ratio band MIN:MAX for slo and kthena (empty: none)"),
		sloUtil:      fs.String("slo-util", "0.6", "with --autoscale slo: comma-separated P[:D] utilizations of the profiled prefill and decode capacity (one run each; D defaults to P)"),
		sloStable:    fs.Duration("slo-stable-window", 180*time.Second, "with --autoscale slo: the policy's stable window (panic window: a third of it)"),
		sloCooldown:  fs.Duration("slo-cooldown", 300*time.Second, "with --autoscale slo: the policy's scale-down cool-down after a scale-up"),
		sloCorrWin:   fs.Duration("slo-correction-window", 0, "with --autoscale slo: each correction is the highest of the steps within this window (0: the current step's)"),
		sloLearned:   fs.Bool("slo-learned-prefill", false, "with --autoscale slo: plan prefill for util P × the router's learned prefill rate of the ready prefill engines, not the profile's throughput (a policy without prefillTokensPerSecond)"),
		sloExpect:    fs.Float64("slo-ttft-expect", 0, "with --autoscale slo: the TTFT correction's expectation: 0 = the profile's no-queue prefill of the p90 prompt, f = f × --slo-ttft"),
		sloTPOTExp:   fs.Float64("slo-tpot-expect", 0, "with --autoscale slo: the TPOT correction's expectation: 0 = the profile's TPOT at the window's streams per ready decode engine, f = f × --slo-tpot (1: the target, as the controller divides)"),
		sloRaise:     fs.Bool("slo-raise-only", false, "with --autoscale slo: corrections only add replicas (the policy's minCorrection 1)"),
		sloLead:      fs.Duration("slo-lead", 0, "with --autoscale slo: size for the load expected this far ahead from the significant upward trend of past windows (0: off)"),
		sloTrend:     fs.Duration("slo-trend-window", 5*time.Minute, "with --autoscale slo and --slo-lead: how far back the trend is fitted"),
		sloBaseline:  fs.Duration("slo-ttft-baseline", 0, "with --autoscale slo: learn the TTFT correction's no-excess ratio as its lowest over this window and correct only the excess (0: off)"),
		sloAggregate: fs.Float64("slo-aggregate-below", 0, "with --autoscale slo: size prefill 0 (its min bound 0) and let decode engines serve whole requests while the fractional prefill plus decode demand is at most this many replicas (the policy's aggregateBelow; 0: off)"),
		kthena:       fs.String("kthena-targets", "2:24", "with --autoscale kthena: comma-separated W:R targets, W waiting requests per prefill pod, R running requests per decode pod (one run each)"),
		duration:     fs.Duration("duration", 90*time.Minute, "with --autoscale: trace length in virtual time"),
		peak:         fs.Float64("peak-rate", 6, "with --shape diurnal: peak requests/s"),
		trough:       fs.Float64("trough-rate", 1, "with --shape diurnal: trough requests/s"),
		base:         fs.Float64("base-rate", 2, "with --shape bursty: base requests/s"),
		burst:        fs.Float64("burst-factor", 0, "with --autoscale: burst rate multiplier (0: the shape's default: diurnal 2, bursty 3)"),
		prefixTokens: fs.Int("prefix-tokens", 1024, "with --autoscale: shared document/system prefix tokens"),
		ownTokens:    fs.Int("own-tokens", 2048, "with --autoscale: mean own prompt tokens"),
		outTokens:    fs.Int("output-tokens", 192, "with --autoscale: mean output tokens"),
	}
}

func (f autoscaleFlags) on() bool { return *f.autoscale != "" }

// runBenchAutoscale runs each requested autoscaler (and grid setting)
// sequentially on the same trace.
func runBenchAutoscale(ctx context.Context, o bench.Options, pdf pdFlags, f autoscaleFlags, stdout io.Writer) error {
	o.Policies, o.Workload = []string{"kvmesh"}, "shared-prefix"
	base, _, err := o.Prepare()
	var probs []string
	if err != nil {
		probs = append(probs, strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
	}
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if o.Mode != "des" {
		bad("--autoscale runs in --mode des only")
	}
	cfg := des.ScaleConfig{PDConfig: des.PDConfig{Config: base, TransferGbps: *pdf.transferGbps, TransferSetup: pdf.setup(),
		SLOTTFT: *pdf.sloTTFT, SLOTPOT: *pdf.sloTPOT, NonCachedTokens: *pdf.nonCached, OutputDist: *pdf.outputDist},
		StartupDelay: *f.startup, SyncPeriod: *f.sync, MaxPerRole: *f.maxPerRole}
	if *f.startup == 0 {
		cfg.StartupDelay = -1
	}
	if *pdf.sloTTFT <= 0 || *pdf.sloTPOT <= 0 {
		bad("--slo-ttft and --slo-tpot must be > 0")
	}
	pdf.checkTransfer(bad)
	reqs, name, err := autoscaleTrace(o, f)
	if err != nil {
		bad("%v", err)
	}
	if len(probs) == 0 {
		used := cfg
		used.Defaults()
		if err := used.CheckTransfers(reqs); err != nil {
			bad("--transfer-gbps, --transfer-setup: %v", err)
		}
	}
	var runs []autoscaleRun
	if len(probs) == 0 {
		runs = f.runs(&cfg, reqs, *pdf.roles, bad)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", bench.ErrUsage, strings.Join(probs, "; "))
	}
	rep := des.ScaleReport{Workload: name, Requests: len(reqs), SLOTTFT: cfg.SLOTTFT.Seconds(), SLOTPOT: cfg.SLOTPOT.Seconds(),
		StartupDelay: max(cfg.StartupDelay, 0).Seconds()}
	var names []string
	for _, r := range runs {
		names = append(names, strings.TrimSpace(r.as.Name()+" "+r.as.Setting()))
	}
	rep.Run = autoscaleRunInfo(&o, base, cfg, reqs, names, *f.shape, *f.initial)
	var outs []bench.Outcome
	for i, r := range runs {
		res, err := des.RunScale(ctx, r.cfg, reqs, r.as)
		if err != nil {
			return err
		}
		if r.as.Name() == "static" && rep.StaticGPUHours == 0 {
			rep.StaticGPUHours = res.GPUHours
		}
		rep.Runs = append(rep.Runs, res)
		outs = append(outs, bench.Outcome{Name: names[i], Completed: res.Completed, Failed: res.Failed})
	}
	// stdout first, then the file (checked writable by Prepare).
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if o.HTML != "" {
		if err := o.WriteScaleHTML(rep); err != nil {
			return err
		}
	}
	return bench.NoneCompleted(outs)
}

// autoscaleRunInfo is an autoscaling run's JSON header: the engines and
// roles slo and kthena start from (static runs at --roles), the
// generated workload's shape, the transfer as run.
func autoscaleRunInfo(o *bench.Options, base des.Config, cfg des.ScaleConfig, reqs []workload.Request, names []string, shape, initial string) *report.RunInfo {
	ri := o.RunInfo(base, reqs, names)
	ri.Kind, ri.Workload = "autoscale", bench.WorkloadSummary(shape, reqs)
	if r, err := des.ParseRoles(initial); err == nil {
		ri.Engines, ri.Roles = r.Total(), report.Ptr(r.String())
	}
	used := cfg
	used.Defaults()
	ri.TransferGbps, ri.TransferSetup = report.Ptr(used.TransferGbps), report.Ptr(used.TransferSetup.Seconds())
	return ri
}

type autoscaleRun struct {
	cfg des.ScaleConfig
	as  des.Autoscaler
}

// runs builds one run per autoscaler and grid setting.
func (f autoscaleFlags) runs(cfg *des.ScaleConfig, reqs []workload.Request, static string, bad func(string, ...any)) []autoscaleRun {
	var out []autoscaleRun
	initial, err := des.ParseRoles(*f.initial)
	if err != nil {
		bad("--initial-roles: %v", err)
	}
	band, err := parseBand(*f.ratio)
	if err != nil {
		bad("--ratio: %v", err)
	}
	for _, name := range strings.Split(*f.autoscale, ",") {
		c := *cfg
		switch strings.TrimSpace(name) {
		case "static":
			if strings.TrimSpace(static) == "" {
				bad("--autoscale static needs --roles prefill=N,decode=M: the static deployment's size")
				continue
			}
			r, err := des.ParseRoles(static)
			if err != nil {
				bad("--autoscale static: --roles: %v", err)
				continue
			}
			c.Roles = r
			out = append(out, autoscaleRun{c, des.Static{}})
		case "slo":
			c.Roles = initial
			out = append(out, f.sloRuns(c, reqs, band, bad)...)
		case "kthena":
			c.Roles = initial
			out = append(out, f.kthenaRuns(c, band, bad)...)
		case "capacity", "clairvoyant":
			c.Roles = initial
			var future []workload.Request
			if strings.TrimSpace(name) == "clairvoyant" {
				future = reqs
			}
			out = append(out, f.capacityRuns(c, future, bad)...)
		default:
			bad("--autoscale: unknown %q (static, slo, kthena, capacity, clairvoyant)", name)
		}
	}
	for _, r := range out {
		v := r.cfg
		v.Defaults()
		if err := v.Validate(); err != nil {
			bad("%v", err)
			break
		}
	}
	return out
}

func (f autoscaleFlags) sloRuns(c des.ScaleConfig, reqs []workload.Request, band *autoscale.Ratio, bad func(string, ...any)) []autoscaleRun {
	st := workload.Summarize(reqs)
	n := max(st.Requests, 1)
	c.Engine = c.Engine.Defaults()
	prof, err := des.ProfileEngine(c.Engine, st.PromptTokens/n, st.OutputTokens/n)
	if err != nil {
		bad("profile: %v", err)
		return nil
	}
	if *f.sloLead < 0 || *f.sloTrend <= 0 || *f.sloBaseline < 0 || *f.sloCorrWin < 0 {
		bad("--slo-lead, --slo-ttft-baseline and --slo-correction-window must be ≥ 0, --slo-trend-window > 0")
		return nil
	}
	if !(*f.sloTPOTExp >= 0) || math.IsInf(*f.sloTPOTExp, 0) {
		bad("--slo-tpot-expect %v: want a finite number ≥ 0 (0: the profile's TPOT)", *f.sloTPOTExp)
		return nil
	}
	var out []autoscaleRun
	for _, u := range strings.Split(*f.sloUtil, ",") {
		pu, du, two := strings.Cut(strings.TrimSpace(u), ":")
		v, err := strconv.ParseFloat(pu, 64)
		dv := v
		if two {
			var err2 error
			dv, err2 = strconv.ParseFloat(du, 64)
			err = errors.Join(err, err2)
		}
		if err != nil || !(v > 0) || !(dv > 0) {
			bad("--slo-util %q: want P[:D] numbers > 0", *f.sloUtil)
			return nil
		}
		p := autoscale.DefaultPolicy()
		p.StableWindow, p.PanicWindow, p.DownCooldown = *f.sloStable, max(*f.sloStable/3, time.Second), *f.sloCooldown
		pmin := int32(1)
		if *f.sloAggregate > 0 {
			pmin = 0 // aggregation needs a prefill role that may go to zero
		}
		p.Roles = map[string]autoscale.RolePolicy{
			"prefill": {Bounds: autoscale.Bounds{Min: pmin, Max: int32(*f.maxPerRole)}},
			"decode":  {Bounds: autoscale.Bounds{Min: 1, Max: int32(*f.maxPerRole)}},
		}
		p.Ratio = band
		s, err := des.NewSLOScaler(des.SLOScalerConfig{Policy: p, Profile: prof, Utilization: v, DecodeUtilization: dv,
			SLOTTFT: c.SLOTTFT.Seconds(), SLOTP: c.SLOTPOT.Seconds(), TTFTExpectation: *f.sloExpect, TPOTExpectation: *f.sloTPOTExp, RaiseOnly: *f.sloRaise,
			Adapt: autoscale.SLOAdapt{Lead: *f.sloLead, TrendWindow: *f.sloTrend, BaselineWindow: *f.sloBaseline,
				CorrectionWindow: *f.sloCorrWin}, LearnedPrefill: *f.sloLearned, AggregateBelow: *f.sloAggregate})
		if err != nil {
			bad("%v", err)
			return nil
		}
		out = append(out, autoscaleRun{c, s})
	}
	return out
}

func (f autoscaleFlags) kthenaRuns(c des.ScaleConfig, band *autoscale.Ratio, bad func(string, ...any)) []autoscaleRun {
	var out []autoscaleRun
	for _, t := range strings.Split(*f.kthena, ",") {
		w, r, ok := strings.Cut(strings.TrimSpace(t), ":")
		wv, err1 := strconv.ParseFloat(w, 64)
		rv, err2 := strconv.ParseFloat(r, 64)
		if !ok || err1 != nil || err2 != nil || !(wv > 0) || !(rv > 0) {
			bad("--kthena-targets %q: want W:R pairs > 0", *f.kthena)
			return nil
		}
		kc := des.KthenaConfig{Behavior: des.DefaultKthenaBehavior(),
			Prefill: des.KthenaRole{Min: 1, Max: int32(*f.maxPerRole), Targets: map[string]float64{des.KthenaWaiting: wv}},
			Decode:  des.KthenaRole{Min: 1, Max: int32(*f.maxPerRole), Targets: map[string]float64{des.KthenaRunning: rv}}}
		if band != nil {
			kc.Ratio = &des.KthenaRatio{Min: band.Min, Max: band.Max}
		}
		k, err := des.NewKthena(kc)
		if err != nil {
			bad("%v", err)
			return nil
		}
		out = append(out, autoscaleRun{c, k})
	}
	return out
}

// capacityRuns are the capacity-table references, one per headroom:
// reactive (future nil: the ingress window's rate) or clairvoyant (the
// trace's arrivals, the future; an analysis reference, no controller).
func (f autoscaleFlags) capacityRuns(c des.ScaleConfig, future []workload.Request, bad func(string, ...any)) []autoscaleRun {
	table, err := des.ParseCapacityTable(*f.capTable)
	if err != nil {
		bad("--capacity-table: %v", err)
		return nil
	}
	var out []autoscaleRun
	for _, h := range strings.Split(*f.capHeadroom, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(h), 64)
		if err != nil {
			bad("--capacity-headroom %q: want numbers > -1", *f.capHeadroom)
			return nil
		}
		s, err := des.NewCapacityScaler(table, v, future)
		if err != nil {
			bad("--capacity-headroom %q: %v", *f.capHeadroom, err)
			return nil
		}
		out = append(out, autoscaleRun{c, s})
	}
	return out
}

func parseBand(s string) (*autoscale.Ratio, error) {
	if s == "" {
		return nil, nil
	}
	lo, hi, ok := strings.Cut(s, ":")
	a, err1 := strconv.ParseFloat(lo, 64)
	b, err2 := strconv.ParseFloat(hi, 64)
	// Written so that NaN, which compares false with everything, fails.
	if !ok || err1 != nil || err2 != nil || !(a > 0) || !(b >= a) || math.IsInf(b, 0) {
		return nil, fmt.Errorf("%q: want MIN:MAX finite numbers with 0 < MIN ≤ MAX", s)
	}
	return &autoscale.Ratio{Numerator: "prefill", Denominator: "decode", Min: a, Max: b}, nil
}

// autoscaleTrace generates the --shape trace.
func autoscaleTrace(o bench.Options, f autoscaleFlags) ([]workload.Request, string, error) {
	mix := workload.LongPromptMix{PrefixTokens: *f.prefixTokens, OwnTokens: *f.ownTokens, OutputTokens: *f.outTokens}
	seed := max(o.Seed, 1)
	switch *f.shape {
	case "diurnal":
		d := workload.Diurnal{Duration: *f.duration, PeakRate: *f.peak, TroughRate: *f.trough, BurstFactor: *f.burst, Mix: mix, Seed: seed}
		r, err := d.Generate()
		return r, fmt.Sprintf("diurnal %v, %.3g→%.3g req/s, seed %d", *f.duration, *f.trough, *f.peak, seed), err
	case "bursty":
		b := workload.Bursty{Duration: *f.duration, BaseRate: *f.base, BurstFactor: *f.burst, Mix: mix, Seed: seed}
		r, err := b.Generate()
		return r, fmt.Sprintf("bursty %v, base %.3g req/s, seed %d", *f.duration, *f.base, seed), err
	}
	return nil, "", fmt.Errorf("--shape %q: diurnal or bursty", *f.shape)
}
