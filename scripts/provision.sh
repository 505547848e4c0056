# Sourced (bash): provisions what the workspace's tests need on this machine, idempotently,
# and exports where it is. Used by scripts/test.sh (README's test command) and .ci/run.
#
#   provision_postgres  a fresh database on the local PostgreSQL (127.0.0.1:5432, user
#                       postgres, trusted from 127.0.0.1), installed and started with apt if
#                       absent; exports LDPSYN_TEST_DATABASE_URL, dropped when the shell exits
#   provision_python    a venv with pandas and pyarrow beside the build cache; exports
#                       LDPSYN_PYTHON
#   provision_browser   Debian's chromium and playwright-core from npm; exports
#                       LDPSYN_NPM_DIR
#
# Installs need root or sudo without a password. Build products and the venv live under
# ~/.cache/ldpsyn so that a second run on the same machine is quick.

LDPSYN_CACHE="${LDPSYN_CACHE:-$HOME/.cache/ldpsyn}"
LDPSYN_SUDO=
[ "$(id -u)" = 0 ] || LDPSYN_SUDO=sudo

ldpsyn_apt() {
  $LDPSYN_SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $LDPSYN_SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ldpsyn_pg_ok() { psql -h 127.0.0.1 -U postgres -d postgres -qAtc 'select 1' >/dev/null 2>&1; }

provision_postgres() {
  if ! ldpsyn_pg_ok; then
    if ! command -v pg_lsclusters >/dev/null || ! command -v psql >/dev/null; then
      ldpsyn_apt postgresql
    fi
    # The tests connect over TCP as `postgres` without a password (as on the development
    # machines); a fresh install asks for one, so trust that user from 127.0.0.1 only.
    pg_lsclusters -h | while read -r ver cluster _port status _; do
      hba="/etc/postgresql/$ver/$cluster/pg_hba.conf"
      if [ -f "$hba" ] && ! $LDPSYN_SUDO grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
        $LDPSYN_SUDO sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
        [ "$status" != online ] || $LDPSYN_SUDO pg_ctlcluster "$ver" "$cluster" reload
      fi
      [ "$status" = online ] || $LDPSYN_SUDO pg_ctlcluster "$ver" "$cluster" start
    done
    for _ in $(seq 30); do ldpsyn_pg_ok && break; sleep 1; done
  fi
  ldpsyn_pg_ok || { echo "PostgreSQL is not reachable on 127.0.0.1:5432 as postgres" >&2; return 1; }
  # A database of this run's own, dropped at exit (a URL already given is used as it is).
  if [ -z "${LDPSYN_TEST_DATABASE_URL:-}" ]; then
    LDPSYN_PG_DB="ldpsyn_test_$(date +%s)_$$"
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $LDPSYN_PG_DB"
    export LDPSYN_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$LDPSYN_PG_DB"
    trap 'psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $LDPSYN_PG_DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
  fi
  # A test whose service is missing fails: never let it skip.
  unset LDPSYN_ALLOW_MISSING_SERVICES
}

provision_python() {
  local venv="$LDPSYN_CACHE/venv"
  command -v python3 >/dev/null || ldpsyn_apt python3
  # pandas reads the CSV and Parquet downloads (examples/pandas/read_synthetic.py).
  if ! "$venv/bin/python" -c 'import pandas, pyarrow' >/dev/null 2>&1; then
    python3 -m venv "$venv" >/dev/null 2>&1 || { ldpsyn_apt python3-venv && rm -rf "$venv" && python3 -m venv "$venv"; }
    "$venv/bin/pip" install -q 'pandas>=2,<3' pyarrow
  fi
  export LDPSYN_PYTHON="$venv/bin/python"
}

provision_browser() {
  local npm_dir="$LDPSYN_CACHE/npm"
  if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'install ok installed'; then
    ldpsyn_apt chromium
  fi
  command -v npm >/dev/null || ldpsyn_apt nodejs npm
  [ -d "$npm_dir/node_modules/playwright-core" ] ||
    npm install --silent --no-audit --no-fund --prefix "$npm_dir" playwright-core >/dev/null
  export LDPSYN_NPM_DIR="$npm_dir"
}
