#!/usr/bin/env bash
# Builds the browser page into web/www: the engine for wasm32 (cargo), its JS bindings
# (wasm-bindgen, at exactly the version Cargo.lock pins), and the demo model beside it.
# Serve web/www on any static server and open it, e.g.:
#   python3 -m http.server -d web/www 8080   # then http://127.0.0.1:8080
# With --clippy (CI) the same build also lints the browser crates for wasm32 (their wasm cfg
# branches: async read-back, no mmap, no threads), warnings denied.
set -euo pipefail
cd "$(dirname "$0")/.."

clippy=false
if [ "${1:-}" = --clippy ]; then
  clippy=true
fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi
# wasm-bindgen's CLI must match the wasm-bindgen crate in Cargo.lock exactly. Installed from
# crates.io only when missing (no --locked: the registry lacks one of its locked versions),
# unoptimized and without the TLS its test runner downloads with: it compiles in under half
# the time (50 s against 116 s on 2 cores) and writes the same files, in 2 s instead of 0.4.
version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$version" ]; then
  echo "installing wasm-bindgen-cli $version (once; about a minute)"
  cargo install wasm-bindgen-cli --version "$version" --no-default-features --debug
fi

# With --clippy the build also lints the browser crates for wasm32 (tests/clippy.sh).
# `.cargo/config.toml` picks getrandom's browser backend for this target.
cargo_args=()
if $clippy; then
  source tests/clippy.sh
  cargo_args=("${clippy_cargo_args[@]}")
fi
cargo build "${cargo_args[@]}" --release --target wasm32-unknown-unknown -p hesper-web
wasm-bindgen --target web --out-dir web/www/pkg \
  target/wasm32-unknown-unknown/release/hesper_web.wasm
mkdir -p web/www/models
cp models/hesper-kjv.gguf web/www/models/
wasm=web/www/pkg/hesper_web_bg.wasm
echo "built web/www: $(stat -c %s "$wasm") bytes of wasm ($(gzip -9 -c "$wasm" | wc -c) gzipped)"
