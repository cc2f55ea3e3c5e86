#!/usr/bin/env bash
# The test command (README): every test of the workspace, on a fresh machine as on a developer's.
#   bash tests/run.sh            # install what the tests need where it is missing, then test
#   bash tests/run.sh --clippy   # the same build also linted by Clippy, warnings denied (CI)
# Further arguments go to the test runner (a name filter, say).
#
# The GPU tests need a WebGPU adapter; where no Vulkan driver is installed (a machine without a
# GPU), Mesa's lavapipe is one and is installed here. A GPU test that finds no adapter fails.
#
# The tests build with the `bench` profile: release code generation (so the dependencies are
# the ones `cargo build --release` uses, built once) with debug assertions and overflow checks in
# hesper-rs' own crates (Cargo.toml). cargo-nextest runs the test binaries side by side when it is
# installed (it is on this project's CI machines); otherwise `cargo test` runs them one by one.
set -euo pipefail
cd "$(dirname "$0")/.."

clippy=false
if [ "${1:-}" = --clippy ]; then
  clippy=true
  shift
fi

# As root, or through sudo where it asks for nothing.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi
}

if [ "$(uname -s)" = Linux ]; then
  icds=$(ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null || true)
  libs=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
  if [ -z "$icds" ] || ! grep -q 'libvulkan\.so\.1' <<<"$libs"; then
    echo "== no Vulkan driver: installing Mesa's lavapipe (mesa-vulkan-drivers libvulkan1)"
    if command -v apt-get >/dev/null &&
      as_root apt-get update -q &&
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q mesa-vulkan-drivers libvulkan1; then
      :
    else
      echo "could not install it; the GPU tests will fail until a Vulkan driver is installed" >&2
    fi
  fi
  export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}
  if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    XDG_RUNTIME_DIR=$(mktemp -d)
    export XDG_RUNTIME_DIR
  fi
fi

# With --clippy the test build is linted (tests/clippy.sh); the same cargo arguments when the
# tests run keep that build fresh.
cargo_args=()
if $clippy; then
  source tests/clippy.sh
  cargo_args=("${clippy_cargo_args[@]}")
  echo "== build, linted (clippy, --all-targets)"
  cargo build "${cargo_args[@]}" --profile bench --workspace --all-targets
fi

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run "${cargo_args[@]}" --cargo-profile bench --workspace --no-fail-fast "$@"
  # nextest runs no doctests; the crates' code blocks are text, but one added later runs here.
  cargo test "${cargo_args[@]}" --profile bench --workspace --doc "$@"
else
  cargo test "${cargo_args[@]}" --profile bench --workspace --no-fail-fast "$@"
fi
