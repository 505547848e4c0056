"""Writes a CSV whose rows drift along their order: sorted by a numeric column plus Gaussian
noise (seeded), so that early rows hold low values and late rows high ones without a hard
cut. Read whole with `bench-utility --arrival file`, it stands for a collection whose people
change while it runs (benchmarks/sweeps/arrival-order.md).

    python3 benchmarks/scripts/drifted.py IN.csv OUT.csv --column age --noise 10 --seed 7

Rows whose column does not parse as a number sort as if it held the column's median."""
import argparse
import csv
import random
import statistics


def main():
    p = argparse.ArgumentParser()
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--column", required=True)
    p.add_argument("--noise", type=float, default=10.0, help="sd of the noise, column units")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    with open(a.input, newline="") as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    j = head.index(a.column)

    def number(x):
        try:
            return float(x)
        except ValueError:
            return None

    median = statistics.median(v for v in (number(r[j]) for r in body) if v is not None)
    rng = random.Random(a.seed)
    keyed = []
    for r in body:
        v = number(r[j])
        keyed.append(((median if v is None else v) + rng.gauss(0.0, a.noise), r))
    keyed.sort(key=lambda kr: kr[0])
    with open(a.output, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerows(r for _, r in keyed)


if __name__ == "__main__":
    main()
