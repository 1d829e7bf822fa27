#!/usr/bin/env python3
"""The prefix hit rate a router can reach with LRU engines, on a Mooncake-format trace.

Replays the trace's block accesses (hash_ids, 512-token blocks) in arrival order against ONE LRU cache holding the
whole cluster's capacity (CAPACITY blocks). Issue 16 takes it as the bound for a router in front of N LRU engines
of capacity C/N: splitting one LRU into N adds copies of shared blocks and evicts by per-engine recency, which is
not a proof that no router can beat it (a router could keep a cold working set apart), but it is what a router that
only places requests can expect at best. Reported as "hit rate against the LRU bound", beside belady.py's
clairvoyant bound, which no LRU engine reaches. A request's blocks are looked up as a prefix: after the
first miss the rest of the prompt is computed (and inserted) even if later blocks were cached, as vLLM's prefix
cache does.

It counts the trace's blocks, each hash id one block whatever its length, so a request's partial last block weighs as
a full one; the DES counts tokens of 16-token blocks. To set a DES hit rate against the bound use
loadtest/analysis/lruhit, which replays the prompts as the DES generates them (on the whole Mooncake synthetic trace at
240,000 blocks: 0.371 there, 0.358 here).

usage: lrubound.py TRACE.jsonl CAPACITY_BLOCKS [CAPACITY_BLOCKS ...]
e.g.   lrubound.py testdata/traces/mooncake_synthetic_trace.jsonl 7500     # 8 engines x 30,000 x 16 tokens / 512
"""
import json
import sys
from collections import OrderedDict


def replay(prompts, cap):
    cache, hits, total = OrderedDict(), 0, 0
    for ids in prompts:
        total += len(ids)
        prefix = True
        for b in ids:
            if prefix and b in cache:
                hits += 1
                cache.move_to_end(b)
            else:
                prefix = False
                cache[b] = True
                cache.move_to_end(b)
                while len(cache) > cap:
                    cache.popitem(last=False)
    return hits / max(total, 1)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    prompts = []
    with open(sys.argv[1]) as f:
        for line in f:
            prompts.append(json.loads(line)["hash_ids"])
    n = sum(map(len, prompts))
    uniq = len({b for p in prompts for b in p})
    print(f"requests {len(prompts)}, accesses {n}, unique blocks {uniq}, infinite-cache hit rate {1 - uniq / n:.3f}")
    for cap in map(int, sys.argv[2:]):
        print(f"capacity {cap} blocks: one-LRU hit rate {replay(prompts, cap):.3f}")


if __name__ == "__main__":
    main()
