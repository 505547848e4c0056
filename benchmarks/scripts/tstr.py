"""ML efficacy of ldpsyn's synthetic data: train on synthetic, test on real (TSTR).

A fixed 70/30 split of a labelled table (seed 0); the collection (`ldpsyn-aggregator demo`,
real HTTP, one simulated device per training row) or the curator (`synthesize`) sees only
the 70%; a gradient-boosting classifier (scikit-learn's HistGradientBoostingClassifier, fixed
seed) is trained on the synthetic rows and scored by ROC AUC on the real 30%. The real-data
AUC (trained on the real 70%) is the ceiling. Lift = AUC - 0.5; `ratio` = synthetic lift /
real lift.

    pip install scikit-learn pandas
    cargo build --release -p ldpsyn-aggregator
    python3 benchmarks/scripts/tstr.py --data examples/adult/adult.csv \
        --schema examples/adult/schema.json --label income --positive '>50K' \
        --epsilon 1 --epsilon 4 --epsilon 8 --arrival shuffled --arrival file --seeds 3 \
        --out benchmarks/results/tstr-adult.json

Each run's command line is in the JSON; `--method` picks what runs (`auto`,
`auto+target`, `privincr`, ..., `synthesize`, `synthesize+target`).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import roc_auc_score

BIN = os.path.join("target", "release", "ldpsyn-aggregator")


def load(path):
    return pd.read_csv(path, encoding="utf-8-sig", skipinitialspace=True, dtype=str)


def features(frame, schema, label, categories):
    """Numeric columns as numbers, categorical ones as codes of the schema's labels."""
    out = {}
    for a in schema["attributes"]:
        name = a["name"]
        if name == label or name not in frame.columns:
            continue
        if a["type"] == "numeric":
            out[name] = pd.to_numeric(frame[name], errors="coerce")
        else:
            cats = categories[name]
            values = frame[name].str.strip()
            values = values.where(values.isin(cats))
            codes = pd.Categorical(values, categories=cats).codes.astype(float)
            codes[codes < 0] = np.nan
            out[name] = codes
    return pd.DataFrame(out)


def auc(train, test, schema, label, positive, seed):
    categories = {
        a["name"]: [str(x) for x in a.get("labels", [])]
        for a in schema["attributes"]
        if a["type"] != "numeric"
    }
    x_train = features(train, schema, label, categories)
    y_train = (train[label].str.strip() == positive).astype(int)
    x_test = features(test, schema, label, categories)
    y_test = (test[label].str.strip() == positive).astype(int)
    if y_train.nunique() < 2:
        return 0.5
    cat_mask = [a["type"] != "numeric" for a in schema["attributes"] if a["name"] != label]
    model = HistGradientBoostingClassifier(random_state=seed, categorical_features=cat_mask)
    model.fit(x_train, y_train)
    return float(roc_auc_score(y_test, model.predict_proba(x_test)[:, 1]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--positive", required=True, help="the label value scored as positive")
    p.add_argument("--epsilon", action="append", type=float)
    p.add_argument("--arrival", action="append", default=None)
    p.add_argument("--method", action="append", default=None)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--bin", default=BIN, help="the ldpsyn-aggregator binary")
    args = p.parse_args()
    epsilons = args.epsilon or [4.0]
    arrivals = args.arrival or ["shuffled"]
    methods = args.method or ["auto", "auto+target"]
    schema = json.load(open(args.schema))
    data = load(args.data)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(data))
    cut = int(0.7 * len(data))
    train, test = data.iloc[np.sort(order[:cut])], data.iloc[np.sort(order[cut:])]
    real = auc(train, test, schema, args.label, args.positive, 0)
    print(f"real: AUC {real:.4f} ({len(train)} train, {len(test)} test rows)", file=sys.stderr)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        train_path = os.path.join(tmp, "train.csv")
        train.to_csv(train_path, index=False)
        for method in methods:
            base, _, flag = method.partition("+")
            for eps in epsilons:
                for arrival in arrivals if base != "synthesize" else ["-"]:
                    for seed in range(1, args.seeds + 1):
                        syn = os.path.join(tmp, "syn.csv")
                        report = os.path.join(tmp, "report.json")
                        if base == "synthesize":
                            cmd = [args.bin, "synthesize", "--data", train_path, "--schema",
                                   args.schema, "--epsilon", str(eps), "--out", syn]
                        else:
                            cmd = [args.bin, "demo", "--quiet", "--data", train_path, "--schema",
                                   args.schema, "--epsilon", str(eps), "--protocol", base,
                                   "--arrival", arrival, "--seed", str(seed), "--out", syn,
                                   "--report", report]
                        if flag == "target":
                            cmd += ["--target", args.label]
                        t0 = time.time()
                        run = subprocess.run(cmd, capture_output=True, text=True)
                        if run.returncode != 0:
                            print(run.stderr[-2000:], file=sys.stderr)
                            raise SystemExit(f"failed: {' '.join(cmd)}")
                        score = auc(load(syn), test, schema, args.label, args.positive, seed)
                        row = {"method": method, "epsilon": eps, "arrival": arrival,
                               "seed": seed, "auc": score,
                               "ratio": (score - 0.5) / (real - 0.5),
                               "seconds": round(time.time() - t0, 1),
                               "command": " ".join(cmd[1:])}
                        if os.path.exists(report) and base != "synthesize":
                            r = json.load(open(report))
                            row["tvd2"] = r.get("tvd2")
                            row["label_edges"] = [
                                e for e in r.get("edges", []) if args.label in e
                            ]
                            os.remove(report)
                        results.append(row)
                        print(json.dumps(row), file=sys.stderr)
    json.dump({"data": args.data, "label": args.label, "positive": args.positive,
               "real_auc": real, "train_rows": len(train), "test_rows": len(test),
               "results": results}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
