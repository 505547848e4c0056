#!/usr/bin/env python3
"""A model of one numeric column's 1-way at eps = 1, outside the engine (numpy, scipy).

16 equal-width bins of an Adult column, n reports split over levels: the flat level is OUE over
the 16 bins, a coarse level is GRR over k bins of equal true mass. The estimate is the
constrained weighted least squares fit of every level (non-negative, summing to 1: what the
engine's graphical-model fit does for one attribute). Prints the mean KS over the bin edges and
the mean signed CDF error where it is reached. Used in benchmarks/sweeps/unresolved-bins.md:
it predicted a gain from a coarse level that the engine did not show.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy scipy
    /tmp/venv/bin/python benchmarks/scripts/oneway_model.py examples/adult/adult.csv
"""
import csv
import sys

import numpy as np
from scipy.optimize import lsq_linear

E = np.exp(1.0)
rng = np.random.default_rng(3)


def var_grr(k, n):
    p, q = E / (E + k - 1), 1 / (E + k - 1)
    return q * (1 - q) / (n * (p - q) ** 2)


def var_oue(k, n):
    return 4 * E / (n * (E - 1) ** 2)


def level(f, groups, n):
    """Unbiased estimates of the groups' masses from n reports, and their variances."""
    k = len(groups)
    g = np.array([f[idx].sum() for idx in groups])
    counts = rng.multinomial(n, g)
    if var_grr(k, 1) <= var_oue(k, 1):
        p, q = E / (E + k - 1), 1 / (E + k - 1)
        out = np.zeros(k)
        for i, c in enumerate(counts):
            keep = rng.binomial(c, p)
            out[i] += keep
            out[np.arange(k) != i] += rng.multinomial(c - keep, np.ones(k - 1) / (k - 1))
        return (out / n - q) / (p - q), np.full(k, var_grr(k, n))
    q = 1 / (E + 1)
    ones = np.array([rng.binomial(counts[i], 0.5) + rng.binomial(n - counts[i], q) for i in range(k)])
    return (ones / n - q) / (0.5 - q), np.full(k, var_oue(k, n))


def equal_mass_groups(f, k):
    c = np.cumsum(f)
    cuts = sorted({int(np.argmin(np.abs(c - j / k))) + 1 for j in range(1, k)} - {0, len(f)})
    b = [0] + cuts + [len(f)]
    return [np.arange(b[i], b[i + 1]) for i in range(len(b) - 1)]


def fit(bins, levels):
    rows, y = [], []
    for groups, est, v in levels:
        for idx, e, vv in zip(groups, est, v):
            a = np.zeros(bins)
            a[idx] = 1 / np.sqrt(vv)
            rows.append(a)
            y.append(e / np.sqrt(vv))
    rows.append(np.ones(bins) * 1e4)
    y.append(1e4)
    x = lsq_linear(np.array(rows), np.array(y), bounds=(0, 1)).x
    return x / x.sum()


def main():
    data = list(csv.DictReader(open(sys.argv[1])))
    n = 2600  # about what `auto` gives one of Adult's numeric 1-ways at eps = 1
    designs = [("flat", [(None, 1.0)]), ("2 bins, 0.2", [(2, 0.2), (None, 0.8)]),
               ("4 bins, 0.2", [(4, 0.2), (None, 0.8)]), ("4 bins, 0.3", [(4, 0.3), (None, 0.7)])]
    for col in ["hours-per-week", "age", "fnlwgt"]:
        x = np.array([float(r[col]) for r in data if r[col].strip() not in ("", "?")])
        edges = np.linspace(x.min(), x.max() + 1e-9, 17)
        f = np.histogram(x, edges)[0] / len(x)
        cdf = np.cumsum(f)
        out = {}
        for name, design in designs:
            ks, signed = [], []
            for _ in range(200):
                levels = []
                for k, share in design:
                    groups = [np.array([i]) for i in range(16)] if k is None else equal_mass_groups(f, k)
                    est, v = level(f, groups, int(n * share))
                    levels.append((groups, est, v))
                d = np.cumsum(fit(16, levels)) - cdf
                ks.append(np.abs(d).max())
                signed.append(d[np.abs(d).argmax()])
            out[name] = (round(float(np.mean(ks)), 4), round(float(np.mean(signed)), 3))
        print(col, out)


if __name__ == "__main__":
    main()
