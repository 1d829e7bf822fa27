#!/usr/bin/env python3
"""Upper bound on the prefix hit rate any cache of a given size can reach on a Mooncake-format trace.

Replays the trace's block accesses (hash_ids, 512-token blocks) against ONE cache holding CAPACITY blocks with
Belady's clairvoyant eviction (evict the block used furthest in the future). No real engine (LRU) and no router
can beat it, so it bounds what routing can achieve at that total cache size.

usage: belady.py TRACE.jsonl CAPACITY_BLOCKS [CAPACITY_BLOCKS ...]
e.g.   belady.py testdata/traces/mooncake_synthetic_trace.jsonl 7500     # 8 engines x 30,000 x 16 tokens / 512
"""
import heapq
import json
import sys


def main() -> None:
    seq = []
    with open(sys.argv[1]) as f:
        for line in f:
            seq.extend(json.loads(line)["hash_ids"])
    n = len(seq)
    nxt, last = [0] * n, {}
    for i in range(n - 1, -1, -1):
        nxt[i] = last.get(seq[i], n + i)
        last[seq[i]] = i
    print(f"accesses {n}, unique blocks {len(set(seq))}, infinite-cache hit rate {1 - len(set(seq)) / n:.3f}")
    for cap in map(int, sys.argv[2:]):
        cache, heap, hits = {}, [], 0
        for i, b in enumerate(seq):
            hits += b in cache
            cache[b] = nxt[i]
            heapq.heappush(heap, (-nxt[i], b))
            while len(cache) > cap:
                neg, victim = heapq.heappop(heap)
                if cache.get(victim) == -neg:
                    del cache[victim]
        print(f"capacity {cap} blocks: Belady hit rate {hits / n:.3f}")


if __name__ == "__main__":
    main()
