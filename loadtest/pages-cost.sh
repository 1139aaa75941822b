#!/usr/bin/env bash
# What a hundred open status pages cost the gateway per PING: the same binary under the same
# ping load, without ("old") and with ("new") loadtest/pages.py holding the pages open,
# interleaved; see before-after.sh.
#
#   loadtest/pages-cost.sh [ROUNDS] [CONNECTIONS] [PAGES]      # about 80 s a round
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p idlegate --manifest-path "$root/Cargo.toml"
bin=$root/target/release/idlegate
NEW_PAGES=${3:-100} exec "$root/loadtest/before-after.sh" "$bin" "$bin" "${1:-2}" "${2:-19000}"
