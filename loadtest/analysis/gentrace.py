#!/usr/bin/env python3
# gentrace.py writes a synthetic trace in Mooncake's JSONL form (timestamp in
# ms, input_length, output_length, hash_ids of 16-token blocks; read it with
# `kvmesh bench --workload trace --trace FILE --trace-block-size 16`): Poisson
# arrivals (optionally 5x bursts), prompts of one of --prefixes shared
# prefixes (Zipf popularity) plus an own part, uniform output lengths
# (optionally a bimodal tail). Used by docs/BENCHMARKS.md's black-box sweep
# of unseen configurations (stop 53); deterministic by --seed.
import json, random, argparse, math
ap = argparse.ArgumentParser()
ap.add_argument("--out"); ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--n", type=int, default=1500); ap.add_argument("--rate", type=float, default=10)
ap.add_argument("--prefixes", type=int, default=100); ap.add_argument("--zipf", type=float, default=0.0)
ap.add_argument("--prefix-min", type=int, default=1024); ap.add_argument("--prefix-max", type=int, default=4096)
ap.add_argument("--own-min", type=int, default=64); ap.add_argument("--own-max", type=int, default=512)
ap.add_argument("--out-min", type=int, default=64); ap.add_argument("--out-max", type=int, default=512)
ap.add_argument("--bimodal-out", type=float, default=0.0, help="prob of out-max*8 length outputs")
ap.add_argument("--burst", type=float, default=0.0, help="fraction of time in 5x bursts")
a = ap.parse_args()
rng = random.Random(a.seed)
B = 16
plen = [rng.randint(a.prefix_min, a.prefix_max) // B * B for _ in range(a.prefixes)]
w = [1.0 / (i + 1) ** a.zipf for i in range(a.prefixes)]
nid = 10_000_000
pids = []
for i in range(a.prefixes):
    pids.append(list(range(nid, nid + plen[i] // B))); nid += plen[i] // B
t = 0.0
with open(a.out, "w") as f:
    for k in range(a.n):
        r = a.rate
        if a.burst and (int(t / 10) % 10) < a.burst * 10: r *= 5
        t += rng.expovariate(r)
        p = rng.choices(range(a.prefixes), weights=w)[0]
        own = rng.randint(a.own_min, a.own_max)
        nb = (own + B - 1) // B
        ids = pids[p] + list(range(nid, nid + nb)); nid += nb
        out = rng.randint(a.out_min, a.out_max)
        if a.bimodal_out and rng.random() < a.bimodal_out: out = a.out_max * 8
        f.write(json.dumps({"timestamp": int(t * 1000), "input_length": plen[p] + own, "output_length": out, "hash_ids": ids}) + "\n")
