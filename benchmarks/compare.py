#!/usr/bin/env python3
"""Markdown tables from the utility suite: mean 2-way TVD ± std (model edges) per dataset,
protocol and ε, and, with a baseline file, the change against it.

    python3 benchmarks/compare.py benchmarks/results/utility.json \
        [--before benchmarks/results/utility-before.json]
"""
import argparse
import json

DATASETS = ["adult-45k", "nist-taxi", "temporal-match2", "bn", "adult-1.5m"]
PROTOCOLS = ["auto", "privincr", "noincremental", "samprivsyn", "independence",
             "exact-independence", "chow-liu", "noprivjtree"]


def load(path):
    return {(r["dataset"], r["protocol"], float(r["epsilon"])): r
            for r in json.load(open(path)) if "tvd2_mean" in r}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("after")
    ap.add_argument("--before")
    a = ap.parse_args()
    after = load(a.after)
    before = load(a.before) if a.before else {}
    eps = sorted({k[2] for k in after})
    for ds in DATASETS:
        cells = {k: v for k, v in after.items() if k[0] == ds}
        if not cells:
            continue
        users = next(iter(cells.values()))["users"]
        print(f"\n### {ds} ({users:,} people)\n")
        head = " | ".join(f"ε = {e:g}" for e in eps)
        print(f"| protocol | {head} | seconds (ε = {eps[-1]:g}) | peak RSS MB |")
        print("|---|" + "---|" * (len(eps) + 2))
        for p in PROTOCOLS:
            row = []
            for e in eps:
                r = cells.get((ds, p, e))
                if r is None:
                    row.append("")
                    continue
                s = f"{r['tvd2_mean']:.3f} ± {r['tvd2_std']:.3f} ({r['model_edges']})"
                b = before.get((ds, p, e))
                if b is not None:
                    s += f" [was {b['tvd2_mean']:.3f}]"
                row.append(s)
            if not any(row):
                continue
            last = cells.get((ds, p, eps[-1]), {})
            print(f"| `{p}` | " + " | ".join(row)
                  + f" | {last.get('seconds_mean', float('nan')):.1f} | {last.get('peak_rss_mb', float('nan')):.0f} |")
    if before:
        worse = [(k, after[k]["tvd2_mean"], before[k]["tvd2_mean"], after[k]["tvd2_std"])
                 for k in sorted(after) if k in before
                 and after[k]["tvd2_mean"] > before[k]["tvd2_mean"]]
        print(f"\nCells worse than before: {len(worse)} of "
              f"{sum(1 for k in after if k in before)}")
        for k, x, y, sd in worse:
            print(f"- {k[0]} {k[1]} ε = {k[2]:g}: {x:.4f} vs {y:.4f} (std {sd:.4f})")


if __name__ == "__main__":
    main()
