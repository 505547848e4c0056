#!/usr/bin/env bash
# Property-based API test: schemathesis (PyPI, own venv) against a live `serve` on 127.0.0.1,
# driven by the server's own OpenAPI document (GET /v1/openapi.json). Fails on any 5xx and on
# any response that does not match the document (status, content type, headers, body).
#
# Usage: .ci/schemathesis.sh [path to the ldpsyn-aggregator binary]
# Env: LDPSYN_ST_MAX_EXAMPLES (default 50 per operation and phase), LDPSYN_ST_SEED (default 1).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-${CARGO_TARGET_DIR:-$HOME/.cache/ldpsyn/target}/debug/ldpsyn-aggregator}"
venv="$HOME/.cache/ldpsyn/venv-schemathesis"
# Pinned: the checks and the config format (dictionaries, [[operations]]) are schemathesis 4's.
st_version="4.32.5"
if ! "$venv/bin/st" --version 2>/dev/null | grep -q "$st_version"; then
  python3 -m venv "$venv" >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    rm -rf "$venv" && python3 -m venv "$venv"
  }
  "$venv/bin/pip" install -q "schemathesis==$st_version"
fi
"$venv/bin/st" --version

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
token="schemathesis-admin-$RANDOM$RANDOM"
# No per-IP rate limit (one client sends everything); small synthetic downloads.
LDPSYN_ADMIN_TOKEN="$token" LDPSYN_LOG=warn "$bin" serve --bind "127.0.0.1:$port" \
  --database-url "sqlite://$work/serve.db" --rate-limit-per-ip 0 --max-synthetic-rows 1000 \
  >"$work/serve.log" 2>&1 &
serve_pid=$!
cleanup() { kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 100); do
  curl -sf "$base/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "$base/healthz" >/dev/null || { cat "$work/serve.log"; exit 1; }

python3 "$here/schemathesis_setup.py" "$base" "$token" "$work/schemathesis.toml"

status=0
cd "$work"  # schemathesis keeps a cache folder in its working directory
timeout 900 "$venv/bin/st" --config-file "$work/schemathesis.toml" run "$base/v1/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-examples "${LDPSYN_ST_MAX_EXAMPLES:-50}" --seed "${LDPSYN_ST_SEED:-1}" --workers 2 \
  --request-timeout 30 --suppress-health-check all --no-color \
  --report ndjson --report-ndjson-path "$work/events.ndjson" || status=$?

# The number of HTTP requests schemathesis sent, and their statuses, from its event log.
python3 - "$work/events.ndjson" <<'PY'
import collections, json, sys
codes, ops = collections.Counter(), set()
for line in open(sys.argv[1]):
    event = json.loads(line)
    finished = event.get("ScenarioFinished")
    if not finished:
        continue
    for interaction in (finished["recorder"].get("interactions") or {}).values():
        response = interaction.get("response")
        codes[response["status_code"] if response else "no response"] += 1
    ops.add(finished["recorder"].get("label"))
total = sum(codes.values())
by_status = ", ".join(f"{k}: {v}" for k, v in sorted(codes.items(), key=str))
print(f"schemathesis: {total} generated requests ({by_status})")
server_errors = sum(v for k, v in codes.items() if isinstance(k, int) and k >= 500)
print(f"schemathesis: {server_errors} server errors (5xx)")
sys.exit(1 if server_errors or total == 0 else 0)
PY
if [ "$status" -ne 0 ]; then
  echo "schemathesis found failures (exit $status); server log:"
  tail -50 "$work/serve.log"
fi
exit "$status"
