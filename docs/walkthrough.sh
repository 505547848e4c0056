#!/usr/bin/env bash
# The guide's walkthrough (docs/guide.md, "Try a server with your own data"), run as written
# and checked: serve → schema infer → create (named) → devices with Adult → finalized at the
# target → download CSV and Parquet → pandas. CI runs it (.ci/run); from the repository root:
#   bash docs/walkthrough.sh
# Environment: LDPSYN_PYTHON (a Python with pandas and pyarrow; default python3),
# WALKTHROUGH_PORT (default 18080).
set -euo pipefail
cd "$(dirname "$0")/.."

A="cargo run --release --locked -q -p ldpsyn-aggregator --"
python="${LDPSYN_PYTHON:-python3}"
port="${WALKTHROUGH_PORT:-18080}"
work=$(mktemp -d)
export LDPSYN_SERVER="http://127.0.0.1:$port"
export LDPSYN_ADMIN_TOKEN
LDPSYN_ADMIN_TOKEN=$(head -c 24 /dev/urandom | base64)

cargo build --release --locked -q -p ldpsyn-aggregator
# 1. serve (a local trial: no per-IP rate limit)
$A serve --bind "127.0.0.1:$port" --database-url "sqlite://$work/try.db" \
  --rate-limit-per-ip 0 > "$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -fsS "$LDPSYN_SERVER/healthz" > /dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "$LDPSYN_SERVER/healthz" > /dev/null || { cat "$work/serve.log"; exit 1; }

# 2. a schema with point masses (capital-gain is 0 for 91.6% of Adult) and native-country kept
$A schema infer --data examples/adult/adult.csv --max-categories 41 > "$work/schema.json"
# 3. create: finalizes by itself at its target
ID=$($A collections create --schema "$work/schema.json" --epsilon 4 --target-users 45222 \
  --name "Adult walkthrough")
# 4. devices: one SDK client per row
$A devices --collection "$ID" --data examples/adult/adult.csv | tee "$work/devices.txt"
grep -qx 'accepted: 45222' "$work/devices.txt"
# 5. finalized at the target; 6. download CSV and Parquet
$A collections status "$ID" --json > "$work/status.json"
$A collections download "$ID" --out "$work/synthetic.csv" --rows 45222 --seed 7 --quiet
$A collections download "$ID" --out "$work/synthetic.parquet" --format parquet --rows 45222 \
  --seed 7 --quiet

# 7. pandas reads both; the synthetic table keeps Adult's columns and its point mass at 0
"$python" - "$work" <<'EOF'
import json, sys
import pandas as pd

work = sys.argv[1]
status = json.load(open(f"{work}/status.json"))
assert "finalized" in json.dumps(status), f"collection not finalized: {status}"
csv = pd.read_csv(f"{work}/synthetic.csv")
parquet = pd.read_parquet(f"{work}/synthetic.parquet")
data = pd.read_csv("examples/adult/adult.csv")
assert len(csv) == len(parquet) == 45222, (len(csv), len(parquet))
assert list(parquet.columns) == list(csv.columns), (parquet.columns, csv.columns)
assert "native-country" in parquet.columns
zeros = (parquet["capital-gain"] == 0).mean()
truth = (pd.to_numeric(data["capital-gain"], errors="coerce") == 0).mean()
print(f"capital-gain = 0: synthetic {zeros:.3f}, data {truth:.3f}")
assert abs(zeros - truth) < 0.08, "the point mass at 0 is lost"
print(parquet.describe(include="all").T.head(15))
EOF
echo "walkthrough: ok ($ID)"
