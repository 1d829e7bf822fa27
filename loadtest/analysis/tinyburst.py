#!/usr/bin/env python3
# tinyburst.py writes docs/BENCHMARKS.md's "A burst of tiny prompts" trace in
# Mooncake's JSONL form: --n unshared prompts of 1-40 tokens (one block id
# each, never repeated), 1-8 output tokens, one arrival every 5 ms (sent all
# at once with `kvmesh bench --rate-scale 1e9`). Deterministic by --seed.
import argparse, json, random
ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True); ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--n", type=int, default=3000)
a = ap.parse_args()
rng = random.Random(a.seed)
with open(a.out, "w") as f:
    for i in range(a.n):
        f.write(json.dumps({"timestamp": 5 * i, "input_length": rng.randint(1, 40),
                            "output_length": rng.randint(1, 8), "hash_ids": [i]}) + "\n")
