"""Cross-check of the sketch encoding's accountant (aggregator/engine/src/measure/sketch_privacy.rs)
with Google's dp_accounting privacy-loss-distribution (PLD) accountant.

One repetition of a person's D sketches sharing the hash Y: without the person each sketch is
Z_j = max(phantom max of k_p geometrics, alpha_min), saturated at 255; with it, max(Y, Z_j).
This script builds the exact pmfs of that mechanism in two independent ways (the (m, c)
reduction of sketch_privacy.rs, and brute force over every output for D = 2), hands the pmfs
to dp_accounting, composes them t times with its PLD accountant (both directions: adding and
removing the person) and prints epsilon at delta. The Rust accountant composes by Renyi DP or
advanced composition, so its epsilon must be at least this (PLD is near-optimal) and, to be
useful, not far above it; the Rust test `sketch_privacy::tests::matches_dp_accounting` holds
the figures printed here.

    pip install dp-accounting==0.6.0
    python3 benchmarks/scripts/sketch_accounting.py
"""
import math
from math import comb

from dp_accounting.pld import privacy_loss_distribution as pld

CAP = 255


def sketch_constants(eps_prime, gamma):
    k = math.ceil(1.0 / math.expm1(eps_prime))
    amin = math.ceil(-math.log(-math.expm1(-eps_prime)) / math.log1p(gamma))
    return k, amin


def z_cdf(m, k, amin, b):
    """P(Z <= m) for the sketch without the person (floor amin, cap 255)."""
    if m < max(amin, 1):
        return 0.0
    if m >= CAP:
        return 1.0
    return math.exp(k * math.log1p(-b ** (-m)))


def y_pmf(y, b):
    return b ** (-(y - 1)) if y == CAP else b ** (-(y - 1)) * (1 - 1 / b)


def pmfs_reduced(eps_prime, gamma, d):
    """Log pmfs over (m, c): m the smallest sketch, c how many sketches equal it."""
    k, amin = sketch_constants(eps_prime, gamma)
    b = 1 + gamma
    lo = max(amin, 1)
    with_, without = {}, {}
    for m in range(lo, CAP + 1):
        f = z_cdf(m, k, amin, b)
        p = f - z_cdf(m - 1, k, amin, b)
        if p <= 0:
            continue
        surv = 1 - f
        for c in range(1, d + 1):
            if c < d and surv <= 0:
                continue
            q = comb(d, c) * p ** c * surv ** (d - c)
            if q <= 0:
                continue
            ratio = (1 - b ** (-(m - 1))) + y_pmf(m, b) * (f / p) ** c
            without[(m, c)] = math.log(q)
            with_[(m, c)] = math.log(q) + math.log(ratio)
    return with_, without


def pmfs_brute_two(eps_prime, gamma):
    """Log pmfs over every output (s1, s2) of two sketches, from the definitions."""
    k, amin = sketch_constants(eps_prime, gamma)
    b = 1 + gamma
    lo = max(amin, 1)
    pz = {m: z_cdf(m, k, amin, b) - z_cdf(m - 1, k, amin, b) for m in range(lo, CAP + 1)}

    def pmax(y, s):
        if s < y:
            return 0.0
        return z_cdf(s, k, amin, b) if s == y else pz[s]

    with_, without = {}, {}
    for s1 in range(lo, CAP + 1):
        for s2 in range(lo, CAP + 1):
            q = pz[s1] * pz[s2]
            w = sum(y_pmf(y, b) * pmax(y, s1) * pmax(y, s2) for y in range(1, min(s1, s2) + 1))
            if q > 0 and w > 0:
                without[(s1, s2)] = math.log(q)
                with_[(s1, s2)] = math.log(w)
    return with_, without


def composed_epsilon(with_, without, t, delta):
    remove = pld.from_two_probability_mass_functions(without, with_, symmetric=False)
    add = pld.from_two_probability_mass_functions(with_, without, symmetric=False)
    out = 0.0
    for one in (remove, add):
        out = max(out, one.self_compose(t).get_epsilon_for_delta(delta))
    return out


def main():
    print("reduction vs brute force, D = 2 (one repetition, delta at eps0 = 0.1):")
    for eps_prime in (0.02, 0.3):
        for name, (w, wo) in (
            ("reduced", pmfs_reduced(eps_prime, 1.0, 2)),
            ("brute", pmfs_brute_two(eps_prime, 1.0)),
        ):
            one = pld.from_two_probability_mass_functions(wo, w, symmetric=False)
            print(f"  eps'={eps_prime} {name:8s} delta(0.1) = {one.get_delta_for_epsilon(0.1):.6e}")
    print()
    print("| eps' | D | t | delta | PLD epsilon (dp_accounting) |")
    print("|---|---|---|---|---|")
    for eps_prime, d, t, delta in (
        (1e-3, 2, 100, 1e-3),
        (1e-4, 2, 2000, 1e-2),
        (2e-7, 8, 2000, 1e-5),
        (1e-8, 15, 2000, 1e-5),
    ):
        w, wo = pmfs_reduced(eps_prime, 1.0, d)
        eps = composed_epsilon(w, wo, t, delta)
        print(f"| {eps_prime:g} | {d} | {t} | {delta:g} | {eps:.6f} |")


if __name__ == "__main__":
    main()
