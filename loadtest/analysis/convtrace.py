#!/usr/bin/env python3
"""Write a multi-turn conversation trace in aiperf's Mooncake form.

Each session opens with one of 20 shared system prompts (4-12 blocks, Zipf
popularity) and a document of its own (log-normal, about 6 blocks), and runs
2-9 turns; each turn's prompt is the previous prompt + the previous answer +
a new user message (log-normal, about 600 tokens), so a session's hash_ids
grow. The first turn has a timestamp (sessions start as a Poisson process);
every later turn has the session's session_id and a delay (exponential think
time, mean 30 s), aiperf's multi-turn form. Blocks of 512 tokens, rounded up.

Not one of the cross-validation's workloads: a held-out check of the trace
reader's aiperf forms and of the policies on traffic none was tuned on.

    python3 loadtest/analysis/convtrace.py SEED OUT.jsonl [DURATION_S [SESSIONS_PER_S]]
"""
import json
import math
import random
import sys

B = 512


def main():
    seed, out = int(sys.argv[1]), sys.argv[2]
    dur = float(sys.argv[3]) if len(sys.argv) > 3 else 900
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.55
    rnd = random.Random(seed)
    nid = [0]

    def new_blocks(n):
        r = list(range(nid[0], nid[0] + n))
        nid[0] += n
        return r

    systems = [new_blocks(rnd.randint(4, 12)) for _ in range(20)]
    zipf = [1 / (i + 1) ** 1.1 for i in range(20)]
    rows, t, s = [], 0.0, 0
    while t < dur:
        t += rnd.expovariate(rate)
        sid = f"conv-{seed}-{s}"
        s += 1
        ctx = list(systems[rnd.choices(range(20), weights=zipf)[0]])
        ctx += new_blocks(max(1, int(rnd.lognormvariate(math.log(6), 0.8))))
        for k in range(rnd.randint(2, 9)):
            o = max(1, int(rnd.lognormvariate(math.log(200), 1.0)))
            row = {"session_id": sid, "input_length": len(ctx) * B - rnd.randint(0, B - 1),
                   "output_length": o, "hash_ids": list(ctx)}
            if k == 0:
                row["timestamp"] = int(t * 1000)
            else:
                row["delay"] = int(rnd.expovariate(1 / 30) * 1000)
            rows.append(row)
            ctx += new_blocks((o + int(rnd.lognormvariate(math.log(600), 0.9))) // B + 1)
            if len(ctx) * B > 120000:
                break
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} requests in {s} sessions", file=sys.stderr)


if __name__ == "__main__":
    main()
