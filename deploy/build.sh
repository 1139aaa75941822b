#!/usr/bin/env bash
# Builds the gateway as shipped: the release profile (no debug info), linked statically
# against glibc (crt-static on the gnu target), so it runs with nothing beside it, as in the
# FROM scratch image. Prints the binary's path.
#
#   deploy/build.sh          -> target/x86_64-unknown-linux-gnu/release/idlegate
#
# DNS still works: glibc's resolver reads /etc/hosts and /etc/resolv.conf itself, which a
# container runtime provides (tests/deploy.rs resolves --redis by name from the image).
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
# An explicit --target keeps the flag off build scripts and proc macros, which cannot be
# static.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -q -p idlegate --target "$target"
echo "target/$target/release/idlegate"
