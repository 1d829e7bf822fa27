// Command lruhit prints, for any workload `kvmesh bench` runs, the bounds a
// router is measured against in the cross-validation table
// (loadtest/analysis/xval.py):
//
//   - lru: the one-LRU bound (workload.LRUHitRate), one LRU cache of the
//     cluster's capacity, in tokens of 16-token blocks;
//   - oracle: the infinite-cache hit rate (workload.OracleHitRate);
//   - with -profile or -profile-file, the zero-queue TTFT bound: each request
//     alone on an engine holding every block an infinite shared cache holds
//     (workload.OracleHits), prefilling the rest in chunks of the engine's
//     token budget. No router can give a request a lower TTFT in the DES
//     (zeroQueueTTFT says why), so its mean and p99 bound every policy's, and
//     a row whose best emulation is already within 1/0.85 of the bound leaves
//     no router room for a mean of 0.85× the best.
//
// It reads the workload exactly as bench does for the same flags.
//
//	go run ./loadtest/analysis/lruhit -workload chat -seed 1 -limit 1000 -capacity 240000 -profile 7b-l40s
package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

func main() {
	var (
		kind     = flag.String("workload", "trace", "trace (Mooncake), bailian, azure, sharegpt, chat, tool-agent, coding, rag, mix or shared-prefix")
		trace    = flag.String("trace", "", "trace file (trace, bailian, azure)")
		seed     = flag.Uint64("seed", 1, "workload seed")
		limit    = flag.Int("limit", 0, "first N requests (0 = all)")
		capacity = flag.Int("capacity", 240000, "cluster KV capacity in blocks (engines × GPU blocks)")
		bs       = flag.Int("block-size", 16, "tokens per block")
		tblock   = flag.Int("trace-block-size", 0, "trace, bailian: tokens per hash_ids block (0 = the format's: 512, Bailian 16)")
		groups   = flag.Int("groups", 64, "shared-prefix groups")
		prompts  = flag.Int("prompts", 16, "shared-prefix prompts per group")
		shared   = flag.Int("shared", 2048, "shared-prefix shared tokens")
		question = flag.Int("question", 128, "shared-prefix question tokens")
		profName = flag.String("profile", "", "engine timing profile for the zero-queue TTFT bound (e.g. 7b-l40s)")
		profFile = flag.String("profile-file", "", "timing profile file (as kvmesh bench --profile-file) for the TTFT bound")
		budget   = flag.Int("max-batch-tokens", 0, "engine token budget per step (0 = the profile's vLLM default)")
	)
	flag.Parse()
	var reqs []workload.Request
	var err error
	switch *kind {
	case "trace", "bailian":
		// Rows without output_length get 1 token: only prompts matter here.
		reqs, err = workload.Mooncake{Seed: *seed, Limit: *limit, BlockTokens: *tblock, Output: 1, Bailian: *kind == "bailian"}.ReadFile(*trace)
	case "azure":
		reqs, err = workload.Azure{Seed: *seed, Limit: *limit}.ReadFile(*trace)
	case "sharegpt":
		reqs, err = workload.ShareGPT{Seed: *seed, Limit: *limit}.ReadFile(*trace)
	case "chat":
		reqs, err = workload.Chat{Seed: *seed, Limit: *limit}.Generate()
	case "tool-agent":
		reqs, err = workload.ToolAgent{Seed: *seed, Limit: *limit}.Generate()
	case "coding":
		reqs, err = workload.Coding{Seed: *seed, Limit: *limit}.Generate()
	case "rag":
		reqs, err = workload.RAG{Seed: *seed, Limit: *limit}.Generate()
	case "mix":
		reqs, err = workload.Mix{Seed: *seed, Limit: *limit}.Generate()
	case "shared-prefix":
		reqs, err = workload.SharedPrefix{Groups: *groups, Prompts: *prompts, Shared: *shared, Question: *question, Output: 1, Seed: *seed}.Generate()
	default:
		err = fmt.Errorf("unknown workload %q", *kind)
	}
	var prof engine.Profile
	switch {
	case err != nil:
	case *profFile != "":
		prof, err = engine.LoadProfileFile(*profFile)
	case *profName != "":
		prof, err = engine.LookupProfile(*profName)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lruhit:", err)
		os.Exit(2)
	}
	fmt.Printf("{\"lru\": %.4f, \"oracle\": %.4f, \"requests\": %d",
		workload.LRUHitRate(reqs, *bs, *capacity), workload.OracleHitRate(reqs, *bs), len(reqs))
	if prof.Params > 0 {
		mean, p99 := ttftBound(reqs, prof, *bs, *budget)
		fmt.Printf(", \"ttft_bound_mean_s\": %.4f, \"ttft_bound_p99_s\": %.4f", mean, p99)
	}
	fmt.Println("}")
}

// ttftBound is the mean and p99 (report.Quantile, as the DES computes its
// own) of zeroQueueTTFT over reqs, in seconds.
func ttftBound(reqs []workload.Request, p engine.Profile, bs, budget int) (mean, p99 float64) {
	if len(reqs) == 0 {
		return 0, 0
	}
	budget = cmp.Or(budget, p.MaxNumBatchedTokens, 8192) // engine.Config's default
	hits := workload.OracleHits(reqs, bs)
	b := make([]float64, len(reqs))
	for i := range reqs {
		b[i] = zeroQueueTTFT(p, budget, bs, reqs[i].PromptTokens, hits[i]).Seconds()
		mean += b[i]
	}
	slices.Sort(b)
	return mean / float64(len(b)), report.Quantile(b, 0.99)
}

// zeroQueueTTFT is a lower bound on the TTFT of a prompt of n tokens of which
// hit lead an infinite shared cache holds, on an engine of profile p with a
// token budget per step. The engine can use at most min(hit, ⌊(n−1)/bs⌋·bs)
// cached tokens (its lookup stops one token short: the last prompt token is
// always computed), so u = n − c tokens must be prefilled in at least
// m = ⌈u/budget⌉ steps. Each step costs at least StepOverhead + PerSeqOverhead
// plus max(FLOPs, bytes) of its own work, and a step shared with other
// requests only costs more; the sum of maxima is at least the maximum of the
// sums, where the FLOPs of u tokens after c cached ones (linear layers plus
// causal attention) do not depend on how they are chunked, and the bytes are
// at least m reads of the weights.
func zeroQueueTTFT(p engine.Profile, budget, bs, n, hit int) time.Duration {
	if n <= 0 {
		return 0
	}
	c := min(hit, (n-1)/bs*bs)
	u := n - c
	m := (u + budget - 1) / budget
	flops := 2*p.Params*float64(u) + 4*float64(p.Layers)*float64(p.Hidden)*float64(u)*(float64(c)+float64(u+1)/2)
	sec := max(flops/p.FLOPS, float64(m)*p.WeightBytes/p.MemBW)
	return time.Duration(m)*(p.StepOverhead+p.PerSeqOverhead) + time.Duration(sec*1e9)
}
