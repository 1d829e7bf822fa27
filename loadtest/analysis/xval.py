#!/usr/bin/env python3
"""Cross-validation of kvmesh's policy on traffic it was not tuned on (issues 16 and 20).

Runs `kvmesh bench --mode des` over the grid

    workloads  mooncake (testdata/traces, Mooncake format), shared-prefix (64 groups x 16 prompts, 2,048 + 128
               tokens, 256 out, 40 rps at 1x), azure (testdata/traces Azure conv CSV with synthetic prefixes),
               chat (multi-turn), tool-agent, and since 2026-12-08 a tester's held-out shapes coding (per-user 20-50k-token
               repository contexts with edits, 1 session/s at 1x), rag (3-6 Zipf-popular documents in random order,
               16 rps at 1x), mix (15 % 8-28k-token summaries beside short chat, 12 rps at 1x) (loadtest/workload
               documents each; their 1x sits below the knee of SGLang's router on 7b-l40s: docs/BENCHMARKS.md)
    rates      0.5x, 1x, 2x each workload's own rate (--rate-scale; shared-prefix: --rate 20/40/80)
    profiles   7b-l40s, 8b-h100 (8 engines x 30,000 GPU blocks of 16 tokens)
    seeds      as given

with the emulations (kthena, kthena-kvcache, sglang, dynamo, llmd, llmd-precise) and kvmesh, each workload cut to its
first --limit requests, one policy at a time (--parallel 1). Results are cached per run in --out, emulations and
kvmesh separately, so a kvmesh change re-runs kvmesh only (--rerun-kvmesh). Then prints the table: per row kvmesh's
mean TTFT / the best emulation's, p99 / the best p99, throughput / the best, load imbalance, hit rate / the one-LRU
bound (loadtest/analysis/lruhit), whether each goal holds, and the floor: the zero-queue TTFT bound (lruhit -profile:
every request alone on an engine holding all an infinite shared cache would) over the best emulation's mean and p99,
the lowest ratio any router could reach; above 0.85 the mean goal is unreachable on that row. --kthena adds the
Kthena scenario (3 engines, 256 x 32 prompts, 4,096 + 256 tokens, 800 rps, concurrency 300) with random and the
strongest emulations.

The split (docs/BENCHMARKS.md, "Cross-validation (unseen traffic)"): TUNING = mooncake and shared-prefix at 1x and
2x on 7b-l40s, seed 1; everything else is evaluation.

usage: xval.py [--seeds 1,2,3] [--workloads ...] [--profiles ...] [--rates ...] [--limit 1000] [--kthena] [--table-only]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EMUS = ["kthena", "kthena-kvcache", "sglang", "dynamo", "llmd", "llmd-precise"]
WORKLOADS = {
    "mooncake": lambda r: ["--workload", "trace", "--trace", "testdata/traces/mooncake_synthetic_trace.jsonl", "--rate-scale", str(r)],
    "shared-prefix": lambda r: ["--workload", "shared-prefix", "--rate", str(40 * r)],
    "azure": lambda r: ["--workload", "azure", "--trace", "testdata/traces/azure_llm_inference_2023_conv.csv", "--rate-scale", str(r)],
    "chat": lambda r: ["--workload", "chat", "--rate-scale", str(r)],
    "tool-agent": lambda r: ["--workload", "tool-agent", "--rate-scale", str(r)],
    "coding": lambda r: ["--workload", "coding", "--rate-scale", str(r)],
    "rag": lambda r: ["--workload", "rag", "--rate-scale", str(r)],
    "mix": lambda r: ["--workload", "mix", "--rate-scale", str(r)],
}
LRU_ARGS = {
    "mooncake": ["-workload", "trace", "-trace", "testdata/traces/mooncake_synthetic_trace.jsonl"],
    "shared-prefix": ["-workload", "shared-prefix"],
    "azure": ["-workload", "azure", "-trace", "testdata/traces/azure_llm_inference_2023_conv.csv"],
    "chat": ["-workload", "chat"],
    "tool-agent": ["-workload", "tool-agent"],
    "coding": ["-workload", "coding"],
    "rag": ["-workload", "rag"],
    "mix": ["-workload", "mix"],
}
KTHENA = ["--engines", "3", "--gpu-blocks", "30000", "--workload", "shared-prefix", "--groups", "256", "--prompts", "32",
          "--shared", "4096", "--question", "256", "--output", "128", "--rate", "800", "--concurrency", "300"]
KTHENA_POLICIES = ["random", "kthena-kvcache", "sglang", "llmd"]
ENGINES, GPU_BLOCKS = 8, 30000


def tuning(wl, rate, prof, seed):
    return wl in ("mooncake", "shared-prefix") and rate in (1, 2) and prof == "7b-l40s" and seed == 1


def run(args, cmd, path, rerun):
    if os.path.exists(path) and not rerun:
        with open(path) as f:
            return json.load(f)
    t = time.time()
    out = subprocess.run([args.bin, "bench", "--mode", "des", "--json", "--parallel", "1"] + cmd, cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    rep = json.loads(out)
    with open(path, "w") as f:
        json.dump(rep, f)
    print(f"  ran {os.path.basename(path)} in {time.time() - t:.0f}s", file=sys.stderr, flush=True)
    return rep


def lru(args, wl, seed):
    path = os.path.join(args.out, f"lru_{wl}_s{seed}_n{args.limit}.json")
    if not os.path.exists(path):
        out = subprocess.run([args.lru] + LRU_ARGS[wl] + ["-seed", str(seed), "-limit", str(args.limit),
                             "-capacity", str(ENGINES * GPU_BLOCKS)], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        with open(path, "w") as f:
            f.write(out)
    with open(path) as f:
        return json.load(f)["lru"]


def bound(args, wl, prof, seed):
    """The zero-queue TTFT bound (lruhit -profile): no router's mean or p99 TTFT can be below it."""
    path = os.path.join(args.out, f"bound_{wl}_{prof}_s{seed}_n{args.limit}.json")
    if not os.path.exists(path):
        out = subprocess.run([args.lru] + LRU_ARGS[wl] + ["-seed", str(seed), "-limit", str(args.limit),
                             "-capacity", str(ENGINES * GPU_BLOCKS), "-profile", prof], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        with open(path, "w") as f:
            f.write(out)
    with open(path) as f:
        b = json.load(f)
    return b["ttft_bound_mean_s"], b["ttft_bound_p99_s"]


def completed(pols, what):
    """The policies that completed a request: one that completed none has
    null throughput and latencies (kvmesh bench prints n/a) and is no one's
    best; kvmesh completing none is a failed row."""
    done = {k: v for k, v in pols.items() if v.get("completed", 1) > 0}
    if "kvmesh" in pols and "kvmesh" not in done:
        raise SystemExit(f"{what}: kvmesh completed no request")
    return done


def kvmesh_config(args):
    return (["--config", args.config] if args.config else []) + (args.kvmesh_flags.split() if args.kvmesh_flags else [])


def row(args, wl, rate, prof, seed):
    base = WORKLOADS[wl](rate) + ["--profile", prof, "--engines", str(ENGINES), "--gpu-blocks", str(GPU_BLOCKS),
                                  "--seed", str(seed)]
    if wl != "shared-prefix":  # its size is --groups x --prompts; kvmesh bench refuses --limit there (never read)
        base += ["--limit", str(args.limit)]
    key = f"{wl}_{rate}x_{prof}_s{seed}_n{args.limit}"
    emu = completed(run(args, base + ["--policies", ",".join(EMUS)], os.path.join(args.out, key + "_emu.json"), False)["policies"], key)
    km = completed(run(args, base + ["--policies", "kvmesh"] + kvmesh_config(args), os.path.join(args.out, key + f"_kvmesh{args.tag}.json"),
                       args.rerun_kvmesh)["policies"], key)["kvmesh"]
    best = lambda m, lo: (min if lo else max)(emu.items(), key=lambda kv: kv[1][m])
    bm, bp, bt = best("ttft_mean_s", True), best("ttft_p99_s", True), best("throughput_rps", False)
    lb = lru(args, wl, seed)
    bmean, bp99 = bound(args, wl, prof, seed)
    r = {"wl": wl, "rate": rate, "prof": prof, "seed": seed, "set": "tuning" if tuning(wl, rate, prof, seed) else "eval",
         "mean": km["ttft_mean_s"] / bm[1]["ttft_mean_s"], "mean_best": bm[0], "km_mean": km["ttft_mean_s"],
         "p99": km["ttft_p99_s"] / bp[1]["ttft_p99_s"], "p99_best": bp[0],
         "tput": km["throughput_rps"] / bt[1]["throughput_rps"], "imb": km["load_imbalance"],
         "hit": km["prefix_hit_rate"], "lru": lb,
         "floor": bmean / bm[1]["ttft_mean_s"], "floor_p99": bp99 / bp[1]["ttft_p99_s"], "hit_lru": km["prefix_hit_rate"] / lb if lb > 0 else float("nan")}
    r["goals"] = {"mean": r["mean"] <= 0.85, "p99": r["p99"] <= 1.0, "tput": r["tput"] >= 0.99, "imb": r["imb"] <= 1.25,
                  "hit": not (r["hit_lru"] < 0.95)}
    return r


def fmt(r):
    g = r["goals"]
    mark = lambda k, s: s if g[k] else f"**{s}**"
    return (f"| {r['wl']} | {r['rate']}x | {r['prof']} | {r['seed']} | {r['set']} | "
            f"{mark('mean', format(r['mean'], '.2f'))} ({r['mean_best']}) | {mark('p99', format(r['p99'], '.2f'))} ({r['p99_best']}) | "
            f"{mark('tput', format(r['tput'], '.3f'))} | {mark('imb', format(r['imb'], '.2f'))} | "
            f"{r['hit']:.3f} / {r['lru']:.3f} = {mark('hit', format(r['hit_lru'], '.2f'))} | {sum(g.values())}/5 | "
            f"{r['floor']:.2f}{' (unreachable)' if r['floor'] > 0.85 else ''} | {r['floor_p99']:.2f} |")


def kthena(args, seed):
    base = KTHENA + ["--profile", "7b-l40s", "--seed", str(seed)]
    key = f"kthena_s{seed}"
    emu = completed(run(args, base + ["--policies", ",".join(KTHENA_POLICIES)], os.path.join(args.out, key + "_emu.json"), False)["policies"], key)
    km = completed(run(args, base + ["--policies", "kvmesh"] + kvmesh_config(args), os.path.join(args.out, key + f"_kvmesh{args.tag}.json"),
                       args.rerun_kvmesh)["policies"], key)["kvmesh"]
    rnd = emu["random"]
    emus = {k: v for k, v in emu.items() if k != "random"}
    bt = max(emus.items(), key=lambda kv: kv[1]["throughput_rps"])
    bm = min(emus.items(), key=lambda kv: kv[1]["ttft_mean_s"])
    x, y, z = km["throughput_rps"] / rnd["throughput_rps"], km["ttft_mean_s"] / rnd["ttft_mean_s"], km["throughput_rps"] / bt[1]["throughput_rps"]
    return (f"| {seed} | {rnd['throughput_rps']:.2f} / {rnd['ttft_mean_s']:.3f} | {bt[0]} {bt[1]['throughput_rps']:.2f} / {bm[0]} {bm[1]['ttft_mean_s']:.3f} | "
            f"{km['throughput_rps']:.2f} / {km['ttft_mean_s']:.3f} / {km['ttft_p99_s']:.2f} | {x:.2f} | {y:.3f} | {z:.3f} | {km['load_imbalance']:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="/tmp/xval/kvmesh", help="kvmesh binary (go build -o it ./cmd/kvmesh)")
    ap.add_argument("--lru", default="/tmp/xval/lruhit", help="lruhit binary (go build -o it ./loadtest/analysis/lruhit)")
    ap.add_argument("--out", default="/tmp/xval/runs")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--profiles", default="7b-l40s,8b-h100")
    ap.add_argument("--rates", default="0.5,1,2")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--rerun-kvmesh", action="store_true", help="re-run kvmesh even when a cached result exists")
    ap.add_argument("--config", help="SchedulerConfig for kvmesh (a variant); results cached under --tag")
    ap.add_argument("--kvmesh-flags", default="", help="extra kvmesh bench flags for kvmesh's runs (a variant, e.g. --learn-unpooled); results cached under --tag")
    ap.add_argument("--tag", default="", help="suffix of kvmesh's cached results (e.g. -old with --config)")
    ap.add_argument("--compare", help="also print each row's ratios for the cached kvmesh results of this tag (e.g. -bound), as default / tag")
    ap.add_argument("--kthena", action="store_true", help="also the Kthena scenario at each seed")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    num = lambda s: int(float(s)) if float(s).is_integer() else float(s)
    rows = []
    print("| workload | rate | profile | seed | set | mean TTFT / best (≤ 0.85) | p99 / best p99 (≤ 1) | throughput / best (≥ 0.99) | imbalance (≤ 1.25) | hit / LRU bound (≥ 0.95) | goals met | zero-queue bound / best mean | bound p99 / best p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seed in map(int, args.seeds.split(",")):
        for prof in args.profiles.split(","):
            for wl in args.workloads.split(","):
                for rate in map(num, args.rates.split(",")):
                    r = row(args, wl, rate, prof, seed)
                    rows.append(r)
                    print(fmt(r), flush=True)
    if rows:
        for s in ("tuning", "eval"):
            sub = [r for r in rows if r["set"] == s]
            if sub:
                met = {k: sum(r["goals"][k] for r in sub) for k in sub[0]["goals"]}
                print(f"\n{s}: {len(sub)} rows; goal met on: " + ", ".join(f"{k} {v}/{len(sub)}" for k, v in met.items()))
    if args.compare:
        print(f"\n| workload | rate | profile | seed | set | mean / best: default, {args.compare} | p99 / best p99 | throughput / best | imbalance | hit / LRU | floor: bound / best mean, p99 |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            a2 = argparse.Namespace(**vars(args))
            a2.tag, a2.config, a2.kvmesh_flags, a2.rerun_kvmesh = args.compare, None, "", False
            c = row(a2, r["wl"], r["rate"], r["prof"], r["seed"])
            cell = lambda k, f: f"{format(r[k], f)} / {format(c[k], f)}"
            print(f"| {r['wl']} | {r['rate']}x | {r['prof']} | {r['seed']} | {r['set']} | {cell('mean', '.2f')} | {cell('p99', '.2f')} | "
                  f"{cell('tput', '.3f')} | {cell('imb', '.2f')} | {cell('hit_lru', '.2f')} | {r['floor']:.2f}, {r['floor_p99']:.2f} |")
        for s in ("tuning", "eval"):
            sub = [r for r in rows if r["set"] == s]
            if sub:
                cs = [row(argparse.Namespace(**{**vars(args), "tag": args.compare, "config": None, "kvmesh_flags": "", "rerun_kvmesh": False}),
                          r["wl"], r["rate"], r["prof"], r["seed"]) for r in sub]
                met = {k: sum(r["goals"][k] for r in cs) for k in cs[0]["goals"]}
                print(f"\n{s} ({args.compare}): {len(cs)} rows; goal met on: " + ", ".join(f"{k} {v}/{len(cs)}" for k, v in met.items()))
    if args.kthena:
        print("\n| seed | random rps / TTFT | best emulation rps / TTFT | kvmesh rps / TTFT / p99 | × random rps (≥ 3) | × random TTFT (≤ 0.2) | × best rps (≥ 1.1) | imbalance |")
        print("|---|---|---|---|---|---|---|---|")
        for seed in map(int, args.seeds.split(",")):
            print(kthena(args, seed), flush=True)


if __name__ == "__main__":
    main()
