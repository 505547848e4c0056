"""What a tree model reaches on Adult under LDP when its structure is given for free.

The reference for `auto`'s Adult-1.5M cells (`benchmarks/sweeps/adult-1.5m-oracle.md`): the
Chow-Liu tree of the data (maximum mutual information, computed from the data: no privacy
spent on structure), every tree edge measured over k x k contiguous bins of equal mass
(VertiMRF section 6.1's binning, the bins placed by the true 1-ways), every attribute alone,
and all N users spent on those factors, one report each, n_f proportional to (w_f K_f)^(2/3)
times a multiplier on the edges (`auto`'s allocation, `Auto::select`). Each factor's estimate
is the exact table plus Gaussian noise of the one variance model (randomizer, with the
better of OUE and GRR, plus sampling), projected onto the simplex; an edge's bins are raked
to its attributes' estimated 1-ways, and the within-bin shape is the estimated 1-way's
(histogram recovery). Every pair's model marginal is computed exactly along the tree, and
the score is the mean 2-way TVD against the data over all pairs, as `bench-utility` reports
it. Non-private parts: the structure and the bin edges.

    python3 benchmarks/scripts/tree_oracle.py --epsilon 1 --users 1500000

Needs numpy. Reads `examples/adult/adult.csv` with `examples/adult/schema.json` (the coding
of the suite's adult rows; Adult-1.5M resamples these 45,222 people).
"""
import argparse
import copy
import csv
import itertools
import json

import numpy as np


def load(data, schema_path):
    schema = json.load(open(schema_path))
    attrs = schema["attributes"]
    rows = [r for r in csv.DictReader(open(data)) if "?" not in r.values()]
    cols, dims = [], []
    for a in attrs:
        if a["type"] == "numeric":
            lo, hi, b = a["min"], a["max"], a["bins"]
            cols.append([min(b - 1, max(0, int((float(r[a["name"]]) - lo) / (hi - lo) * b))) for r in rows])
            dims.append(b)
        else:
            lab = {label: i for i, label in enumerate(a["labels"])}
            cols.append([lab[r[a["name"]]] for r in rows])
            dims.append(len(a["labels"]))
    return np.array(cols).T, dims


class Oracle:
    """The data's tables and tree, computed once; `at(epsilon, rng)` gives one LDP run's view."""

    def __init__(self, x, dims, users):
        self.x, self.dims, self.users = x, dims, users
        self.eps, self.rng = None, None
        self.d = len(dims)
        n = len(x)
        self.one = [np.bincount(x[:, j], minlength=dims[j]) / n for j in range(self.d)]
        self.pair = {}
        for i, j in itertools.combinations(range(self.d), 2):
            t = np.zeros((dims[i], dims[j]))
            np.add.at(t, (x[:, i], x[:, j]), 1)
            self.pair[(i, j)] = t / n
        self.tree = self.chow_liu()

    def at(self, epsilon, rng):
        """This oracle measuring at `epsilon` with noise from `rng` (shares the data's tables)."""
        run = copy.copy(self)
        run.eps, run.rng = epsilon, rng
        return run

    def chow_liu(self):
        def mi(t):
            pa, pb = t.sum(1, keepdims=True), t.sum(0, keepdims=True)
            m = t > 0
            return (t[m] * np.log(t[m] / (pa @ pb)[m])).sum()

        w = {e: mi(t) for e, t in self.pair.items()}
        inside, tree = {0}, []
        while len(inside) < self.d:
            e = max((e for e in w if (e[0] in inside) != (e[1] in inside)), key=lambda e: w[e])
            tree.append(e)
            inside |= set(e)
        return tree

    def variance(self, f, n):
        """The one variance model at n reports, the better oracle for the table's cells."""
        e = np.exp(self.eps)
        k = f.size
        sampling = f * (1 - f) / n
        p, q = e / (e + k - 1), 1 / (e + k - 1)
        grr = (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (n * (p - q) ** 2)
        p, q = 0.5, 1 / (e + 1)
        oue = (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (n * (p - q) ** 2)
        return (grr if grr.sum() <= oue.sum() else oue) + sampling

    def measure(self, f, n):
        noisy = f + self.rng.normal(size=f.shape) * np.sqrt(self.variance(f, n))
        u = np.sort(noisy.ravel())[::-1]
        c = np.cumsum(u) - 1
        r = np.nonzero(u - c / np.arange(1, u.size + 1) > 0)[0][-1]
        return np.maximum(noisy - c[r] / (r + 1), 0)

    def binned(self, e, k):
        i, j = e
        cut = lambda p, k: np.minimum((np.cumsum(p) - p / 2) * k, k - 1).astype(int)
        bi, bj = cut(self.one[i], min(k, self.dims[i])), cut(self.one[j], min(k, self.dims[j]))
        table = np.zeros((bi.max() + 1, bj.max() + 1))
        np.add.at(table, (bi[:, None].repeat(self.dims[j], 1), bj[None, :].repeat(self.dims[i], 0)), self.pair[e])
        return bi, bj, table

    def noise_scale(self, f):
        return np.sqrt(2 / np.pi) * np.sqrt(self.variance(f, 1)).sum()

    def edge_table(self, e, k, n, p1):
        bi, bj, table = self.binned(e, k)
        t = self.measure(table, n)
        mi_, mj_ = np.bincount(bi, p1[e[0]], t.shape[0]), np.bincount(bj, p1[e[1]], t.shape[1])
        for _ in range(50):
            t *= (mi_ / np.maximum(t.sum(1), 1e-300))[:, None]
            t *= (mj_ / np.maximum(t.sum(0), 1e-300))[None, :]
        ci = p1[e[0]] / np.maximum(mi_[bi], 1e-300)
        cj = p1[e[1]] / np.maximum(mj_[bj], 1e-300)
        return t[bi][:, bj] * ci[:, None] * cj[None, :]

    def score(self, p1, tables):
        cond = {}
        for (i, j), t in tables.items():
            cond[(i, j)] = t / np.maximum(p1[i][:, None], 1e-300)
            cond[(j, i)] = t.T / np.maximum(p1[j][:, None], 1e-300)
        adj = {a: [] for a in range(self.d)}
        for i, j in tables:
            adj[i].append(j)
            adj[j].append(i)
        tvd = []
        for u in range(self.d):
            joint, stack = {u: np.diag(p1[u])}, [u]
            while stack:
                x = stack.pop()
                for y in adj[x]:
                    if y not in joint:
                        joint[y] = joint[x] @ cond[(x, y)]
                        stack.append(y)
            for v in range(u + 1, self.d):
                m = joint[v] if v in joint else np.outer(p1[u], p1[v])
                tvd.append(0.5 * np.abs(m - self.pair[(u, v)]).sum())
        return float(np.mean(tvd))

    def run(self, k, multiplier, edges=True):
        a1 = [((self.d - 1) * self.noise_scale(p)) ** (2 / 3) for p in self.one]
        ae = [multiplier * self.noise_scale(self.binned(e, k)[2]) ** (2 / 3) for e in self.tree] if edges else []
        total = sum(a1) + sum(ae)
        p1 = [self.measure(p, self.users * a / total) for p, a in zip(self.one, a1)]
        tables = {e: self.edge_table(e, k, self.users * a / total, p1) for e, a in zip(self.tree, ae)}
        return self.score(p1, tables), sum(ae) / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="examples/adult/adult.csv")
    ap.add_argument("--schema", default="examples/adult/schema.json")
    ap.add_argument("--epsilon", type=float, action="append")
    ap.add_argument("--users", type=int, default=1_500_000)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    x, dims = load(args.data, args.schema)
    print(f"{len(x)} people, domains {dims}; N = {args.users:,} users")
    data = Oracle(x, dims, args.users)
    for eps in args.epsilon or [1.0, 2.0, 4.0, 8.0]:
        o = [data.at(eps, np.random.default_rng(s)) for s in range(args.seeds)]
        exact = o[0].score(o[0].one, {})
        full = o[0].score(o[0].one, {e: o[0].pair[e] for e in o[0].tree})
        print(f"\neps = {eps}: exact independence {exact:.4f}, exact Chow-Liu tree {full:.4f}")
        print(f"  LDP, 1-ways only (independence): {np.mean([r.run(2, 1, edges=False)[0] for r in o]):.4f}")
        print("  | k | exact binned tree | x1 | x3 | x10 | (edge share of users at x1) |")
        for k in [2, 4, 6, 8, 16]:
            cells = []
            share = None
            for mult in [1, 3, 10]:
                res = [r.run(k, mult) for r in o]
                cells.append(np.mean([s for s, _ in res]))
                if mult == 1:
                    share = res[0][1]
            exact_binned = exact_tree(o[0], k)
            print(f"  | {k} | {exact_binned:.4f} | " + " | ".join(f"{c:.4f}" for c in cells) + f" | {share:.2f} |")


def exact_tree(o, k):
    """The tree with its edges exact over k x k bins and exact 1-ways (no noise)."""
    tables = {}
    for e in o.tree:
        bi, bj, t = o.binned(e, k)
        mi_, mj_ = t.sum(1), t.sum(0)
        ci = o.one[e[0]] / np.maximum(mi_[bi], 1e-300)
        cj = o.one[e[1]] / np.maximum(mj_[bj], 1e-300)
        tables[e] = t[bi][:, bj] * ci[:, None] * cj[None, :]
    return o.score(o.one, tables)


if __name__ == "__main__":
    main()
