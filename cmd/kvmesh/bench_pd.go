package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/des"
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
}

func pdBenchFlags(fs *flag.FlagSet) pdFlags {
	return pdFlags{
		roles:        fs.String("roles", "", "P/D cluster: prefill=N,decode=M[,mixed=K] (replaces --engines; policies become P/D policies: "+joinNames(des.PDPolicies)+")"),
		transferGbps: fs.Float64("transfer-gbps", 100, "with --roles: prefill → decode KV bandwidth, Gbit/s"),
		transferSet:  fs.Duration("transfer-setup", 2*time.Millisecond, "with --roles: fixed cost of one KV transfer"),
		sloTTFT:      fs.Duration("slo-ttft", 2*time.Second, "with --roles: goodput's TTFT objective"),
		sloTPOT:      fs.Duration("slo-tpot", 50*time.Millisecond, "with --roles: goodput's time-per-output-token objective"),
		nonCached:    fs.Int("llmd-non-cached-tokens", 16, "with --roles: llm-d's prefix-based P/D decider threshold"),
	}
}

func (f pdFlags) on() bool { return *f.roles != "" }

// config builds the P/D benchmark config on base, reporting problems with bad.
func (f pdFlags) config(base des.Config, bad func(string, ...any)) des.PDConfig {
	if !f.on() {
		return des.PDConfig{}
	}
	roles, err := des.ParseRoles(*f.roles)
	if err != nil {
		bad("--roles: %v", err)
	}
	if *f.transferSet <= 0 {
		*f.transferSet = time.Nanosecond // PDConfig reads 0 as its default
	}
	c := des.PDConfig{Config: base, Roles: roles, TransferGbps: *f.transferGbps, TransferSetup: *f.transferSet,
		SLOTTFT: *f.sloTTFT, SLOTPOT: *f.sloTPOT, NonCachedTokens: *f.nonCached}
	if err == nil {
		v := c
		v.Defaults()
		if err := v.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if *f.sloTTFT <= 0 || *f.sloTPOT <= 0 {
		bad("--slo-ttft and --slo-tpot must be > 0")
	}
	if *f.nonCached < 0 {
		bad("--llmd-non-cached-tokens %d: want ≥ 0", *f.nonCached)
	}
	return c
}

func runBenchPD(ctx context.Context, cfg des.PDConfig, reqs []workload.Request, names []string, jsonOut bool, stdout io.Writer) error {
	rep, err := des.RunPD(ctx, cfg, reqs, names)
	if err != nil {
		return err
	}
	if jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	st := workload.Summarize(reqs)
	fmt.Fprintf(stdout, "workload: %d requests, %d prompt + %d output tokens, arrivals over %.1fs; %d engines (%s), transfer %.0f Gbit/s\n",
		st.Requests, st.PromptTokens, st.OutputTokens, st.Duration.Seconds(), cfg.Roles.Total(), cfg.Engine.Profile.Name, cfg.TransferGbps)
	return rep.WriteTable(stdout)
}

func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

func joinNames(ns []string) string {
	s := ""
	for i, n := range ns {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}
