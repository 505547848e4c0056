#!/usr/bin/env bash
# README's test command: provisions what the tests need (a database on the local PostgreSQL,
# a Python venv with pandas, Chromium with playwright-core; scripts/provision.sh), then runs
# the workspace's tests. Arguments go to `cargo test`, e.g. `bash scripts/test.sh -p ldpsyn`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/provision.sh
source scripts/provision.sh
provision_postgres
provision_python
provision_browser
cargo test --workspace --locked "$@"
