"""Times the client (randomizer) side of two Python LDP libraries on ldpsyn's randomize
workloads and prints them side by side with ldpsyn's figures.

multi-freq-ldpy 0.2.5: GRR_Client (numba-jitted) and UE_Client(optimal=True) (OUE), one call
per report, values in 0..k-1. pure-ldp 1.2.0: DEClient (direct encoding = GRR) and
UEClient(use_oue=True), `privatise` per report, items 1..k (its default index mapper is
x - 1). Pair-GRR: two GRR clients at eps/2 per report, as in SamPrivSyn.

Usage: python peers.py --ours ours.txt   (ours.txt: lines printed by
`cargo bench -p ldpsyn --bench throughput`). Single thread: per-core figures.
"""

import argparse
import math
import time

import numpy as np
from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Client
from multi_freq_ldpy.pure_frequency_oracles.UE import UE_Client
from pure_ldp.frequency_oracles.direct_encoding import DEClient
from pure_ldp.frequency_oracles.unary_encoding import UEClient

WORKLOADS = (
    [("grr", (k,)) for k in (2, 16, 256)]
    + [("oue", (k,)) for k in (16, 256, 4096)]
    + [("grr_pair", (16, 16)), ("grr_pair", (9, 16))]
)
EPSILONS = (1.0, 4.0)


def rate(one_report, batch_s):
    """Reports per second of `one_report(i)`: the fastest of 25 batches of ~`batch_s` seconds
    each after a warm-up (best-of-batches, as ldpsyn's throughput bench does, so that other
    load on a shared machine biases neither side)."""

    def run(n):
        # Thread CPU time, the clock ldpsyn's throughput bench reads too: other processes on
        # a shared machine are not charged to either side.
        start = time.thread_time()
        for i in range(n):
            one_report(i)
        return time.thread_time() - start

    n = 16  # warm-up (numba compiles on the first call) and batch sizing
    while run(n) < batch_s / 4:
        n *= 2
    n = max(1, int(batch_s / (run(n) / n)))
    return max(n / run(n) for _ in range(25))


def multi_freq_client(mech, dims, eps):
    if mech == "grr":
        (k,) = dims
        return lambda i: GRR_Client(i % k, k, eps)
    if mech == "oue":
        (k,) = dims
        return lambda i: UE_Client(i % k, k, eps, True)
    k1, k2 = dims
    half = eps / 2
    return lambda i: (GRR_Client(i % k1, k1, half), GRR_Client(i % k2, k2, half))


def pure_ldp_client(mech, dims, eps):
    if mech == "grr":
        (k,) = dims
        c = DEClient(epsilon=eps, d=k)
        return lambda i: c.privatise(i % k + 1)
    if mech == "oue":
        (k,) = dims
        c = UEClient(epsilon=eps, d=k, use_oue=True)
        return lambda i: c.privatise(i % k + 1)
    k1, k2 = dims
    c1, c2 = DEClient(epsilon=eps / 2, d=k1), DEClient(epsilon=eps / 2, d=k2)
    return lambda i: (c1.privatise(i % k1 + 1), c2.privatise(i % k2 + 1))


def read_ours(path):
    """{(mech, 'AxB', eps): reports_per_s} from the throughput bench's lines."""
    ours = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 6 or parts[0] != "ldpsyn":
                continue
            fields = dict(p.split("=", 1) for p in parts[3:])
            ours[(parts[1], parts[2], float(fields["eps"]))] = float(fields["reports_per_s"])
    return ours


def fmt_rate(r):
    return f"{r:,.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--batch", type=float, default=0.02, help="seconds per timed batch")
    args = ap.parse_args()
    np.random.seed(1)
    ours = read_ours(args.ours)
    print("| workload | eps | ldpsyn reports/s | ldpsyn ns/report | multi-freq-ldpy reports/s "
          "| ldpsyn / multi-freq-ldpy | pure-ldp reports/s | ldpsyn / pure-ldp |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for eps in EPSILONS:
        for mech, dims in WORKLOADS:
            label = "x".join(map(str, dims))
            mine = ours.get((mech, label, eps), math.nan)
            mf = rate(multi_freq_client(mech, dims, eps), args.batch)
            pl = rate(pure_ldp_client(mech, dims, eps), args.batch)
            print(f"| {mech} {label} | {eps:g} | {fmt_rate(mine)} | {1e9 / mine:.1f} | "
                  f"{fmt_rate(mf)} | {mine / mf:,.0f}x | {fmt_rate(pl)} | {mine / pl:,.0f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
