#!/bin/bash
# The demo at several sizes (issue 34 item 4): seconds per phase and peak RSS of
#   ldpsyn-aggregator demo --data examples/adult/adult.csv --schema examples/adult/schema-points.json
#     --users N --epsilon 4 --seed 1
# for each N given (default 100000 1000000 10000000), one after another, then a Markdown table.
#   benchmarks/scripts/demo-scale.sh [N...]
# AGGREGATOR (default target/release/ldpsyn-aggregator) is the binary; OUT (default
# benchmarks/results/demo-scale) the folder for each run's report (`N.json`) and the table
# (`../demo-scale.md`). The synthetic CSVs go to a temporary folder and are removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
AGGREGATOR=${AGGREGATOR:-target/release/ldpsyn-aggregator}
OUT=${OUT:-benchmarks/results/demo-scale}
[ $# -gt 0 ] || set -- 100000 1000000 10000000
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | head -c1)
for n in "$@"; do
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  "$AGGREGATOR" demo --quiet --data examples/adult/adult.csv \
    --schema examples/adult/schema-points.json --users "$n" --epsilon 4 --seed 1 \
    --out "$tmp/synthetic.csv" --report "$OUT/$n.json"
  python3 - "$OUT/$n.json" "$commit${dirty:+ (uncommitted changes)}" "$load" <<'PY'
import json, sys
path, commit, load = sys.argv[1:]
r = json.load(open(path))
r["made_at"] = commit
r["loadavg_before"] = load
json.dump(r, open(path, "w"), indent=2)
PY
  rm -f "$tmp/synthetic.csv"
done
python3 - "$OUT" "$@" > "$OUT/../demo-scale.md" <<'PY'
import json, sys, os
out, sizes = sys.argv[1], sys.argv[2:]
print("# The demo at scale: seconds per phase and peak RSS\n")
print("Written by `benchmarks/scripts/demo-scale.sh " + " ".join(sizes) + "` (release build), "
      "Adult resampled to each size with `--schema examples/adult/schema-points.json "
      "--epsilon 4 --seed 1`, one process (aggregator on SQLite, simulated devices, download "
      "and evaluation), on 2 CPUs. `download` includes reading the rows back and counting "
      "them as they arrive; `evaluate` is what is left after the last byte.\n")
print("| people | load | upload | reports/s | finalize | download | evaluate | total | peak RSS | 2-way TVD | commit | load average before |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in sizes:
    r = json.load(open(os.path.join(out, f"{n}.json")))
    p = r["seconds_by_phase"]
    print(f"| {int(n):,} | {p['load']:.1f} s | {p['upload']:.1f} s | "
          f"{r['reports_accepted'] / p['upload']:,.0f} | {p['finalize']:.1f} s | "
          f"{p['download']:.1f} s | {p['evaluate']:.1f} s | {r['seconds_total']:.1f} s | "
          f"{r['peak_rss_bytes'] / 2**20:,.0f} MiB | {r['tvd2']:.4f} | {r['made_at']} | "
          f"{r['loadavg_before']} |")
PY
cat "$OUT/../demo-scale.md"
