"""Drift of a CSV along its row order: per attribute, the 1-way TVD between each fifth of the
rows (in file order) and the whole file. The simulator assigns people to rounds in arrival
order, so a file that drifts hands each round of a multi-round protocol a different
sub-population (benchmarks/sweeps/arrival-order.md).

    python3 benchmarks/scripts/drift.py [--shuffled SEED] FILE.csv [FILE.csv ...]

--shuffled SEED measures the rows in a seeded random order instead: what sampling alone
shows, the baseline a drift is compared with.

Columns with more than 1,000 distinct values (raw continuous numbers such as Adult's fnlwgt,
whose every fifth differs from the file in most values) are left out."""
import argparse
import csv
import random
from collections import Counter

MAX_DISTINCT = 1000


def main(paths, shuffled):
    for path in paths:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        head, rows = rows[0], rows[1:]
        if shuffled is not None:
            random.Random(shuffled).shuffle(rows)
        n = len(rows)
        out = []
        for j, col in enumerate(head):
            whole = Counter(r[j] for r in rows)
            if len(whole) > MAX_DISTINCT:
                continue
            tv = []
            for s in range(5):
                seg = rows[s * n // 5:(s + 1) * n // 5]
                c = Counter(r[j] for r in seg)
                tv.append(0.5 * sum(abs(c[k] / len(seg) - whole[k] / n) for k in whole))
            out.append((max(tv), col, tv))
        out.sort(reverse=True)
        print(f"{path} ({n} rows, {len(out)} attributes): fifth-vs-file 1-way TVD, largest first")
        for m, col, tv in out[:6]:
            print(f"  {col:24s} " + " ".join(f"{x:.3f}" for x in tv))
        print(f"  median over attributes of the largest fifth: {sorted(o[0] for o in out)[len(out) // 2]:.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--shuffled", type=int, default=None, metavar="SEED")
    a = p.parse_args()
    main(a.files, a.shuffled)
