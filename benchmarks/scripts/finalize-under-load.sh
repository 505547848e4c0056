#!/bin/bash
# Upload and /healthz latency while a wide collection is finalized, against one `serve` binary:
#   benchmarks/scripts/finalize-under-load.sh SERVE_BIN PORT [bench-finalize args...]
# e.g. after `cargo build --release -p ldpsyn-aggregator -p ldpsyn-examples --bin bench-finalize`:
#   benchmarks/scripts/finalize-under-load.sh target/release/ldpsyn-aggregator 18431 \
#     --reports 300000 --labels 100 --baseline-seconds 3
# Starts the server on a fresh SQLite file in a temporary directory (127.0.0.1:PORT), runs
# bench-finalize (BENCH, default target/release/bench-finalize) against it, stops it.
set -u
SERVE=$1; PORT=$2; shift 2
BENCH=${BENCH:-target/release/bench-finalize}
DIR=$(mktemp -d)
export LDPSYN_ADMIN_TOKEN=bench-admin-token-0123456789
"$SERVE" serve --bind 127.0.0.1:"$PORT" --database-url "sqlite://$DIR/b.db" \
  --rate-limit-per-ip 0 >"$DIR/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done
"$BENCH" --url "http://127.0.0.1:$PORT" "$@"
kill "$PID"; wait "$PID" 2>/dev/null
rm -rf "$DIR"
