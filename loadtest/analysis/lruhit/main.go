// Command lruhit prints the one-LRU bound (workload.LRUHitRate) and the
// infinite-cache oracle for any workload `kvmesh bench` runs, in tokens of
// 16-token blocks: the "hit rate vs the LRU bound" column of the
// cross-validation table (loadtest/analysis/xval.py). It reads the
// workload exactly as bench does for the same flags.
//
//	go run ./loadtest/analysis/lruhit -workload chat -seed 1 -limit 1000 -capacity 240000
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvmesh/kvmesh/loadtest/workload"
)

func main() {
	var (
		kind     = flag.String("workload", "trace", "trace (Mooncake), azure, chat, tool-agent or shared-prefix")
		trace    = flag.String("trace", "", "trace file (trace, azure)")
		seed     = flag.Uint64("seed", 1, "workload seed")
		limit    = flag.Int("limit", 0, "first N requests (0 = all)")
		capacity = flag.Int("capacity", 240000, "cluster KV capacity in blocks (engines × GPU blocks)")
		bs       = flag.Int("block-size", 16, "tokens per block")
		groups   = flag.Int("groups", 64, "shared-prefix groups")
		prompts  = flag.Int("prompts", 16, "shared-prefix prompts per group")
		shared   = flag.Int("shared", 2048, "shared-prefix shared tokens")
		question = flag.Int("question", 128, "shared-prefix question tokens")
	)
	flag.Parse()
	var reqs []workload.Request
	var err error
	switch *kind {
	case "trace":
		reqs, err = workload.Mooncake{Seed: *seed, Limit: *limit}.ReadFile(*trace)
	case "azure":
		reqs, err = workload.Azure{Seed: *seed, Limit: *limit}.ReadFile(*trace)
	case "chat":
		reqs, err = workload.Chat{Seed: *seed, Limit: *limit}.Generate()
	case "tool-agent":
		reqs, err = workload.ToolAgent{Seed: *seed, Limit: *limit}.Generate()
	case "shared-prefix":
		reqs, err = workload.SharedPrefix{Groups: *groups, Prompts: *prompts, Shared: *shared, Question: *question, Output: 1, Seed: *seed}.Generate()
	default:
		err = fmt.Errorf("unknown workload %q", *kind)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lruhit:", err)
		os.Exit(2)
	}
	fmt.Printf("{\"lru\": %.4f, \"oracle\": %.4f, \"requests\": %d}\n",
		workload.LRUHitRate(reqs, *bs, *capacity), workload.OracleHitRate(reqs, *bs), len(reqs))
}
