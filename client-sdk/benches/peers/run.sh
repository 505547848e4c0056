#!/usr/bin/env bash
# Randomize throughput of ldpsyn vs two Python LDP libraries (multi-freq-ldpy, pure-ldp) on
# the same workloads (GRR k ∈ {2,16,256}, OUE k ∈ {16,256,4096}, pair-GRR 16×16 and 9×16, at
# ε ∈ {1,4}), one thread each, printed as a Markdown table.
#
# Needs python3 with venv and network access to PyPI on the first run. The venv lives in
# $LDPSYN_PEERS_VENV (default ~/.cache/ldpsyn/peers-venv). Respects CARGO_TARGET_DIR.
# Both sides report the fastest of 25 timed batches (LDPSYN_BATCH_MS, default 20 ms).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${LDPSYN_PEERS_VENV:-$HOME/.cache/ldpsyn/peers-venv}"

if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import multi_freq_ldpy, pure_ldp.frequency_oracles" 2>/dev/null; then
  # pure-ldp imports scikit-learn and statsmodels from its package `__init__` without
  # declaring them.
  "$venv/bin/pip" install --quiet "multi-freq-ldpy==0.2.5" "pure-ldp==1.2.0" scikit-learn statsmodels
fi

ours="$(mktemp)"
trap 'rm -f "$ours"' EXIT
(cd "$root" && cargo bench --quiet -p ldpsyn --bench throughput) | tee "$ours" >&2
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2
batch_ms="${LDPSYN_BATCH_MS:-20}"
"$venv/bin/python" "$here/peers.py" --ours "$ours" --batch "$(awk "BEGIN { print $batch_ms / 1000 }")"
