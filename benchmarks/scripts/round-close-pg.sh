#!/bin/bash
# usage (from the repository root, PostgreSQL on 127.0.0.1:5432): benchmarks/scripts/round-close-pg.sh AGGREGATOR_BINARY SECONDS
# A SamPrivSyn collection of the Adult schema (batch 2000: a round closes every 2000 reports) under
# loadgen batch uploads for SECONDS; prints throughput, rounds closed, commit time, and the time a
# restart takes to answer /healthz with everything stored.
BIN=$1; SECS=$2; DB=ldpsyn_bench_$$
psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $DB"
export LDPSYN_ADMIN_TOKEN=bench-admin-token-123456 LDPSYN_TOKEN_KEY=bench-token-key-0123456789abcdef0123456789 LDPSYN_RATE_LIMIT_PER_IP=0 LDPSYN_LOG=warn
$BIN serve --bind 127.0.0.1:18282 --database-url postgres://postgres@127.0.0.1:5432/$DB > /tmp/cb-serve.log 2>&1 &
PID=$!
for i in $(seq 1 100); do curl -fs http://127.0.0.1:18282/healthz >/dev/null && break; sleep 0.1; done
ID=$(python3 -c "
import json;print(json.dumps({'schema':json.load(open('examples/adult/schema.json')),'protocol':'samprivsyn','epsilon':4,'target_users':1500000,'batch_size':2000}))" | curl -fsS -X POST http://127.0.0.1:18282/v1/collections -H "authorization: Bearer $LDPSYN_ADMIN_TOKEN" -H 'content-type: application/json' --data-binary @- | python3 -c 'import json,sys;print(json.load(sys.stdin)["id"])')
${LOADGEN:-target/release/loadgen} --url http://127.0.0.1:18282 --mode batch --seconds $SECS --collection $ID --server-pid $PID 2>&1 | tail -8
curl -fs http://127.0.0.1:18282/metrics | grep -E "^ldpsyn_(reports_total|rounds_closed_total|commit_seconds_(sum|count))" 
# restart time
kill $PID; wait $PID 2>/dev/null
T0=$(date +%s.%N)
$BIN serve --bind 127.0.0.1:18282 --database-url postgres://postgres@127.0.0.1:5432/$DB > /tmp/cb-serve2.log 2>&1 &
PID=$!
for i in $(seq 1 3000); do curl -fs http://127.0.0.1:18282/healthz >/dev/null && break; sleep 0.05; done
echo "restart to healthy: $(echo "$(date +%s.%N) - $T0" | bc) s"
kill $PID; wait $PID 2>/dev/null
psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE $DB WITH (FORCE)"
