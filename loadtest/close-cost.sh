#!/usr/bin/env bash
# The kernel's floor under a mass expiry (loadtest/baselines/close_cost.rs): every way of saying
# goodbye to N loopback clients, timed on one core with nothing but the system calls.
#
#   loadtest/close-cost.sh [connections] [runs] [out file]
#                                      (defaults: 9500 3 target/close-cost.txt; about a minute)
#
# The server side runs on core SERVER_CPU (default 0), the peer on LOAD_CPU (default 1); the
# modes run RUNS times, interleaved. Each line: the mode, the time for all N, per connection,
# and TCP segments per connection (both directions).
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
N=${1:-9500}
RUNS=${2:-3}
OUT=${3:-target/close-cost.txt}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
command -v taskset >/dev/null || { echo "close-cost.sh: needs taskset (apt-get install util-linux)" >&2; exit 2; }
cargo build --release -q -p loadtest --bin close_cost
BIN=target/release/close_cost
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
for run in $(seq 1 "$RUNS"); do
  for mode in write write-shutdown-close more-shutdown-close write-close more-close; do
    lines=$(mktemp)
    taskset -c "$SERVER_CPU" "$BIN" "$mode" "$N" >"$lines" &
    server=$!
    until [ -s "$lines" ]; do sleep 0.05; done
    taskset -c "$LOAD_CPU" "$BIN" peer "$(head -1 "$lines")" "$N"
    wait "$server"
    line=$(sed -n 2p "$lines")
    rm -f "$lines"
    echo "run $run $line" | tee -a "$OUT"
  done
done
