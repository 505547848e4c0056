#!/usr/bin/env bash
# The reference central-DP synthesizer of benchmarks/results/central.md: private-pgm's MST
# (McKenna, Sheldon, Miklau, "Winning the NIST Contest", JPC 2021), run from a checkout of
# github.com/ryan112358/private-pgm (commit 4d2b3c5 was measured) on the same coded tables as
# bench-central, saving synthetic CSVs that `bench-central --external` scores.
#
#   PGM=path/to/private-pgm PY=path/to/python DATA=../shared/datasets OUT=dir \
#     bash benchmarks/scripts/mst_reference.sh [EPSILON…]
#
# PY: a Python with `pip install path/to/private-pgm matplotlib networkx scipy "pandas<2.2"
# "jax[cpu]==0.4.38"` (the checkout's mechanisms need that jax and pandas). JAX_ENABLE_X64
# is set, as mbi advises; on Adult at ε = 0.8 float32 gave the same TVD within 2%.
set -euo pipefail
: "${PGM:?checkout of private-pgm}" "${PY:?python with its deps}" "${DATA:?shared datasets}" "${OUT:?output folder}"
mkdir -p "$OUT"
eps_list=("$@")
[ ${#eps_list[@]} -gt 0 ] || eps_list=(0.8 1.6 3.2)
# BR2000's schema → private-pgm's domain file ({"attr": size}).
"$PY" - "$DATA/br2000/br2000-schema.json" "$OUT/br2000-domain.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
json.dump({a["name"]: len(a["labels"]) for a in s["attributes"]}, open(sys.argv[2], "w"))
PY
cd "$PGM/mechanisms"
for run in 1 2; do
  for eps in "${eps_list[@]}"; do
    for ds in adult br2000; do
      if [ "$ds" = adult ]; then
        data="$DATA/adult-privmrf/adult.csv" dom="$DATA/adult-privmrf/adult-domain.json"
      else
        data="$DATA/br2000/br2000.csv" dom="$OUT/br2000-domain.json"
      fi
      out="$OUT/mst-$ds-$eps-$run.csv"
      [ -f "$out" ] && continue
      JAX_ENABLE_X64=True "$PY" mst.py --dataset "$data" --domain "$dom" --epsilon "$eps" \
        --delta 1e-9 --degree 2 --save "$out" 2>&1 | grep -v -i warn | tail -1
    done
  done
done
