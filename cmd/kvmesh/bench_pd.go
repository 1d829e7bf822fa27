package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/bench"
	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// pdFlags are `kvmesh bench`'s prefill/decode options: --roles switches the
// discrete-event benchmark to a P/D cluster and P/D policies.
type pdFlags struct {
	roles        *string
	transferGbps *float64
	transferSet  *time.Duration
	sloTTFT      *time.Duration
	sloTPOT      *time.Duration
	nonCached    *int
	mixedPrefill *bool
	outputDist   *bool
}

func pdBenchFlags(fs *flag.FlagSet) pdFlags {
	return pdFlags{
		roles:        fs.String("roles", "", "P/D cluster: prefill=N,decode=M[,mixed=K] (replaces --engines; policies become P/D policies: "+strings.Join(des.PDPolicies, ", ")+")"),
		transferGbps: fs.Float64("transfer-gbps", 100, "with --roles: prefill → decode KV bandwidth, Gbit/s"),
		transferSet:  fs.Duration("transfer-setup", 2*time.Millisecond, "with --roles: fixed cost of one KV transfer"),
		sloTTFT:      fs.Duration("slo-ttft", 2*time.Second, "with --roles: goodput's TTFT objective"),
		sloTPOT:      fs.Duration("slo-tpot", 50*time.Millisecond, "with --roles: goodput's time-per-output-token objective"),
		nonCached:    fs.Int("llmd-non-cached-tokens", 16, "with --roles: llm-d's prefix-based P/D decider threshold"),
		outputDist:   fs.Bool("output-dist", true, "with --roles or --autoscale: kvmesh prices decode engines' streams' TPOT risk over the output lengths of the streams engines run (finished requests weighted by their time at the engine), not their mean"),
		mixedPrefill: fs.Bool("mixed-prefill", true, "with --roles: kvmesh may send prefill legs to mixed engines (kv_role kv_both)"),
	}
}

func (f pdFlags) on() bool { return *f.roles != "" }

// checkTransfer refuses a bandwidth or setup the KV transfer cannot have,
// by flag (des.PDConfig reads a zero bandwidth as its default 100 Gbit/s:
// `--transfer-gbps 0` ran at 100 while the header said 0).
func (f pdFlags) checkTransfer(bad func(string, ...any)) {
	if g := *f.transferGbps; !(g > 0) || math.IsInf(g, 0) {
		bad("--transfer-gbps %v: want a finite bandwidth > 0, in Gbit/s", g)
	}
	if *f.transferSet < 0 {
		bad("--transfer-setup %v: want ≥ 0", *f.transferSet)
	}
}

// setup is --transfer-setup as des.PDConfig takes it: 0 (none) as 1 ns,
// since the config reads 0 as its default (2 ms).
func (f pdFlags) setup() time.Duration { return max(*f.transferSet, time.Nanosecond) }

// runBenchPD is `kvmesh bench --roles ...`: loadtest/bench checks the
// shared options (with a stand-in aggregated policy list, since the P/D
// policies are not scheduler policies), then des.RunPD runs the P/D ones.
func runBenchPD(ctx context.Context, fs *flag.FlagSet, o bench.Options, f pdFlags, stdout io.Writer) error {
	names := des.PDPolicies
	if flagGiven(fs, "policies") {
		names = o.Policies
	}
	o.Policies = []string{"kvmesh"}
	base, _, err := o.Prepare()
	var probs []string
	if err != nil {
		probs = append(probs, strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
	}
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	var pols []string
	for _, p := range names {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
		case !slices.Contains(des.PDPolicies, p):
			bad("--policies: unknown P/D policy %q with --roles (known: %s)", p, strings.Join(des.PDPolicies, ", "))
		case slices.Contains(pols, p):
			bad("--policies: %q given twice", p)
		default:
			pols = append(pols, p)
		}
	}
	if len(pols) == 0 {
		bad("--policies is empty")
	}
	roles, rerr := des.ParseRoles(*f.roles)
	if rerr != nil {
		bad("--roles: %v", rerr)
	}
	f.checkTransfer(bad)
	cfg := des.PDConfig{Config: base, Roles: roles, TransferGbps: *f.transferGbps, TransferSetup: f.setup(),
		SLOTTFT: *f.sloTTFT, SLOTPOT: *f.sloTPOT, NonCachedTokens: *f.nonCached, MixedPrefill: *f.mixedPrefill, OutputDist: *f.outputDist}
	if o.Mode != "des" {
		bad("--roles runs in --mode des only (a live P/D cluster on loopback: kvmesh demo --pd)")
	}
	if *f.sloTTFT <= 0 || *f.sloTPOT <= 0 {
		bad("--slo-ttft and --slo-tpot must be > 0")
	}
	if *f.nonCached < 0 {
		bad("--llmd-non-cached-tokens %d: want ≥ 0", *f.nonCached)
	}
	if len(probs) == 0 {
		v := cfg
		v.Defaults()
		if err := v.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", bench.ErrUsage, strings.Join(probs, "; "))
	}
	reqs, err := o.Requests()
	if err != nil {
		return fmt.Errorf("%w: %v", bench.ErrUsage, err)
	}
	used := cfg
	used.Defaults()
	if err := used.CheckTransfers(reqs); err != nil {
		return fmt.Errorf("%w: --transfer-gbps, --transfer-setup: %v", bench.ErrUsage, err)
	}
	rep, err := des.RunPD(ctx, cfg, reqs, pols)
	if err != nil {
		return err
	}
	rep.Run = o.RunInfo(base, reqs, pols)
	rep.Run.Kind, rep.Run.Engines, rep.Run.Roles = "pd", roles.Total(), report.Ptr(roles.String())
	rep.Run.TransferGbps, rep.Run.TransferSetup = report.Ptr(used.TransferGbps), report.Ptr(used.TransferSetup.Seconds())
	// stdout first, then the files (checked writable by Prepare): a file
	// that fails after all loses no result.
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		st := workload.Summarize(reqs)
		fmt.Fprintf(stdout, "workload: %d requests, %d prompt + %d output tokens, arrivals over %.1fs; %d engines (%s), transfer %g Gbit/s + %v setup\n",
			st.Requests, st.PromptTokens, st.OutputTokens, st.Duration.Seconds(), roles.Total(), base.Engine.Profile.Name, used.TransferGbps, used.TransferSetup)
		bench.WriteWorkloadNotes(stdout, st)
		if err := rep.WriteTable(stdout); err != nil {
			return err
		}
	}
	if o.HTML != "" {
		if err := o.WritePDHTML(rep, reqs, cfg); err != nil {
			return err
		}
	}
	r, _ := rep.AsReport()
	if o.RequestsCSV != "" {
		if err := o.WriteRequestsCSV(r); err != nil {
			return err
		}
	}
	var outs []bench.Outcome
	for _, p := range r.Order {
		outs = append(outs, bench.Outcome{Name: p, Completed: r.Policies[p].Completed, Failed: r.Policies[p].Failed})
	}
	return bench.NoneCompleted(outs)
}

func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
