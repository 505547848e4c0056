#!/usr/bin/env python3
"""Writes a table of 10 independent categorical attributes (2 to 40 values, each with a
skewed random marginal; 50,000 rows, seeded, standard library only) to standard output: data
with no dependence at all, where the independence model is the truth and only the 1-ways'
noise counts (benchmarks/sweeps/one-way-allocation.md). Schema: schema.json beside it."""
import csv
import random
import sys

DOMAINS = [2, 3, 5, 8, 12, 16, 24, 40, 2, 6]
ROWS = 50_000

rng = random.Random(7)
marginals = []
for k in DOMAINS:
    w = [rng.random() ** 2 for _ in range(k)]
    marginals.append([x / sum(w) for x in w])
out = csv.writer(sys.stdout, lineterminator="\n")
out.writerow([f"a{i}" for i in range(len(DOMAINS))])
for _ in range(ROWS):
    out.writerow([rng.choices(range(k), weights=p)[0] for k, p in zip(DOMAINS, marginals)])
