#!/usr/bin/env bash
# Builds the npm-ready package wasm-client/pkg/ (and pkg/node/ for node) from the ldpsyn-wasm
# crate. Idempotent; works on a fresh Debian 12 machine (root or sudo for apt):
#   - apt: rustc-web, cargo-web, rust-web-src (std sources), lld-22 (wasm-ld), nodejs, npm;
#   - wasm-bindgen-cli at exactly the wasm-bindgen version of Cargo.lock (cargo install);
#   - cargo build --release for wasm32 with -Zbuild-std (Debian's rustc 1.96; rustup cannot
#     download the wasm32 std here, see ../shared/wasm/README.md);
#   - wasm-bindgen --target web into pkg/, an ES-module node build into pkg/node/, package.json.
# Every PATH/toolchain setting stays inside this script's process.
#
# Environment: LDPSYN_WASM_TARGET_DIR (default ~/.cache/ldpsyn/target-wasm),
#   LDPSYN_WASM_OPT=1 to also run wasm-opt -Oz from npm's binaryen (cached in ~/.cache/ldpsyn/npm).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${LDPSYN_CACHE:-$HOME/.cache/ldpsyn}
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
export CARGO_TARGET_DIR=${LDPSYN_WASM_TARGET_DIR:-$CACHE/target-wasm}
mkdir -p "$CACHE"

t0=$(date +%s)
step() { printf '[build.sh %4ss] %s\n' $(($(date +%s) - t0)) "$*"; }

# ------------------------------------------------------------------ apt packages (idempotent)
APT_PKGS=(rustc-web cargo-web rust-web-src lld-22 ca-certificates)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# node and npm may come from elsewhere (e.g. NodeSource's nodejs bundles npm): check the commands.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  # rustc-web and rust-web-src must come from the same apt run (std sources match the compiler).
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" rustc-web rust-web-src >/dev/null
fi

# ------------------------------------------------------------------ toolchain (this process only)
# Debian's cargo/rustc 1.96 before rustup's proxies; $CARGO_HOME/bin (wasm-bindgen) after them.
export PATH="/usr/bin:$CARGO_HOME/bin:$PATH"
export RUSTC_BOOTSTRAP=1 # also in .cargo/config.toml [env]; lets -Zbuild-std through
test -f /usr/lib/rustlib/src/rust/library/Cargo.lock || {
  echo "build.sh: std sources missing (apt package rust-web-src)" >&2; exit 1; }

# ------------------------------------------------------------------ wasm-bindgen-cli == Cargo.lock
WBG_VER=$(awk '$0=="name = \"wasm-bindgen\""{getline; gsub(/version = |"/,""); print; exit}' "$HERE/Cargo.lock")
have=$("$CARGO_HOME/bin/wasm-bindgen" --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$WBG_VER" ]; then
  step "cargo install wasm-bindgen-cli $WBG_VER (had: ${have:-none})"
  # From / so this crate's .cargo/config.toml (target wasm32, build-std) is not read. No
  # --locked: its shipped lock file pins crates the index here may not offer. Its own target
  # dir so it does not disturb the wasm one.
  (cd / && CARGO_TARGET_DIR="$CACHE/target-wasm-bindgen-cli" \
     cargo install -q wasm-bindgen-cli --version "=$WBG_VER")
fi

# ------------------------------------------------------------------ release build
step "cargo build --release (wasm32-unknown-unknown, build-std)"
(cd "$HERE" && cargo build --release --locked --lib)
WASM="$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/ldpsyn_wasm.wasm"

# ------------------------------------------------------------------ bindings + package
step "wasm-bindgen --target web -> pkg/, --target experimental-nodejs-module -> pkg/node/"
rm -rf "$HERE/pkg"
"$CARGO_HOME/bin/wasm-bindgen" --remove-name-section --remove-producers-section --target web --out-dir "$HERE/pkg" "$WASM"
"$CARGO_HOME/bin/wasm-bindgen" --remove-name-section --remove-producers-section --target experimental-nodejs-module --out-dir "$HERE/pkg/node" "$WASM"

if [ "${LDPSYN_WASM_OPT:-0}" = 1 ]; then
  step "wasm-opt -Oz (npm binaryen)"
  [ -x "$CACHE/npm/node_modules/.bin/wasm-opt" ] ||
    npm install --silent --no-audit --no-fund --prefix "$CACHE/npm" binaryen >/dev/null
  for f in "$HERE/pkg/ldpsyn_wasm_bg.wasm" "$HERE/pkg/node/ldpsyn_wasm_bg.wasm"; do
    "$CACHE/npm/node_modules/.bin/wasm-opt" -Oz --enable-bulk-memory --enable-nontrapping-float-to-int \
      --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue \
      "$f" -o "$f.opt" && mv "$f.opt" "$f"
  done
fi

# node: an ES module build (instantiated when imported) behind an entry with the same shape as
# the web one (`import init, { LdpClient } from "ldpsyn-wasm"`; init() has nothing to do there).
cat > "$HERE/pkg/node/index.mjs" <<'EOF'
import * as wasm from "./ldpsyn_wasm.js";
export * from "./ldpsyn_wasm.js";
/** Nothing to do under node: the module is instantiated when imported. */
export default async function init() { return wasm; }
export function initSync() { return wasm; }
EOF

VERSION=$(awk -F'"' '/^version = /{print $2; exit}' "$HERE/Cargo.toml")
cat > "$HERE/pkg/package.json" <<EOF
{
  "name": "ldpsyn-wasm",
  "version": "$VERSION",
  "description": "ldpsyn for web pages: submit a record under local differential privacy (fetch, localStorage budget ledger, browser CSPRNG)",
  "license": "Apache-2.0",
  "type": "module",
  "main": "./ldpsyn_wasm.js",
  "module": "./ldpsyn_wasm.js",
  "types": "./ldpsyn_wasm.d.ts",
  "exports": {
    ".": {
      "types": "./ldpsyn_wasm.d.ts",
      "node": "./node/index.mjs",
      "default": "./ldpsyn_wasm.js"
    },
    "./ldpsyn_wasm_bg.wasm": "./ldpsyn_wasm_bg.wasm",
    "./package.json": "./package.json"
  },
  "files": [
    "ldpsyn_wasm.js",
    "ldpsyn_wasm.d.ts",
    "ldpsyn_wasm_bg.wasm",
    "ldpsyn_wasm_bg.wasm.d.ts",
    "snippets/",
    "node/"
  ],
  "sideEffects": ["./snippets/*"],
  "engines": { "node": ">=18" }
}
EOF

raw=$(stat -c %s "$HERE/pkg/ldpsyn_wasm_bg.wasm")
gz=$(gzip -9 -c "$HERE/pkg/ldpsyn_wasm_bg.wasm" | wc -c)
step "pkg/ldpsyn_wasm_bg.wasm: $raw bytes raw, $gz bytes gzipped (-9)"
if [ "$raw" -gt 400000 ]; then
  echo "build.sh: the .wasm is larger than 400 kB" >&2; exit 1
fi
step "done"
