#!/usr/bin/env python3
"""Write a synthetic dataset in ShareGPT's format (random English words), for
`kvmesh bench --workload sharegpt` where the real ShareGPT file is not at hand.

Usage: python3 loadtest/analysis/sharegpt_synth.py [--conversations 600] [--seed 7] > sharegpt_synth.json

Conversations: 20 % open with a system turn of 20-200 words; 1-8 user turns
(weights 2,2,1,1,1,1 over 1,2,3,4,6,8), user turns lognormal(3.5, 1.0)+2
words, answers lognormal(4.5, 0.7)+2 words (ShareGPT's short questions and
longer answers).
"""
import argparse
import json
import random
import sys

WORDS = ("the of and to in a is that for it as was with be by on not he i this are or his from at which but have an "
         "they you were her she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way "
         "well down should because each just those people how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while last might us "
         "great old year off come since against go came right used take three").split()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=600)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)

    def text(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    convs = []
    for c in range(a.conversations):
        turns = []
        if rng.random() < 0.2:
            turns.append({"from": "system", "value": text(rng.randint(20, 200))})
        for _ in range(rng.choice([1, 1, 2, 2, 3, 4, 6, 8])):
            turns.append({"from": "human", "value": text(int(rng.lognormvariate(3.5, 1.0)) + 2)})
            turns.append({"from": "gpt", "value": text(int(rng.lognormvariate(4.5, 0.7)) + 2)})
        convs.append({"id": str(c), "conversations": turns})
    json.dump(convs, sys.stdout)


if __name__ == "__main__":
    main()
