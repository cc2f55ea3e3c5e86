# Sourced by tests/run.sh and web/build.sh for --clippy: Clippy's driver becomes the compiler of
# the workspace's own crates, so a build is also the lint run (`cargo clippy` would check every
# crate, dependencies included, a second time). clippy-driver compiles as rustc does and adds
# Clippy's lints. It is given as cargo configuration (`clippy_cargo_args`, for every cargo command
# that must find that build fresh), not in the environment, so a cargo run that a test starts
# (the compile-fail suite) uses plain rustc. CLIPPY_ARGS is `-D warnings` as `cargo clippy` passes it.
clippy_cargo_args=(--config "build.rustc-workspace-wrapper=\"$(rustc --print sysroot)/bin/clippy-driver\"")
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
