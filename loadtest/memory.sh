#!/usr/bin/env bash
# Resident memory per connection over a run, every 5 seconds: does it settle, and where?
#
#   loadtest/memory.sh [connections] [seconds] [out file]
#                                  (defaults: 19000 55 target/memory.txt; about a minute a run)
#
# idlegate (timeout 30 s) on core SERVER_CPU (default 0), 19,000 clients pinging every
# second on LOAD_CPU (default 1). A run longer than the timeout shows whether memory keeps
# growing once every ring slot has been used. Runs the gateway twice: as it starts, and with
# GLIBC_TUNABLES set (to a setting that changes nothing), which makes it leave glibc's
# allocator at its defaults (src/main.rs, tune_malloc). Each line: the run, then the bytes
# per connection above the gateway's memory at start, every 5 s.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
CONNECTIONS=${1:-19000}
DURATION=${2:-55}
OUT=${3:-target/memory.txt}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT=17070
command -v taskset >/dev/null || { echo "memory.sh: needs taskset (apt-get install util-linux)" >&2; exit 2; }
cargo build --release -q -p idlegate -p loadtest --bins
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
rss() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$1/status"; }

# measure LABEL [env assignments...]
measure() {
  local label=$1
  shift
  env "$@" taskset -c "$SERVER_CPU" target/release/idlegate serve --listen "127.0.0.1:$PORT" --admin-listen 127.0.0.1:0 \
    --api-listen 127.0.0.1:0 2>/dev/null &
  local pid=$!
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
  done
  local start line
  start=$(rss "$pid")
  taskset -c "$LOAD_CPU" target/release/loadtest --target "127.0.0.1:$PORT" --connections "$CONNECTIONS" \
    --connect-rate 5000 --silent-fraction 0 --ping-interval 1s --duration "${DURATION}s" \
    --source-ips 127.0.0.1-127.0.0.4 >/dev/null 2>&1 &
  local load=$!
  line="$label:"
  for _ in $(seq 1 $((DURATION / 5 - 1))); do
    sleep 5
    line="$line $((($(rss "$pid") - start) / CONNECTIONS))"
  done
  wait "$load" || true
  kill "$pid"
  wait "$pid" || true
  echo "$line" | tee -a "$OUT"
}

measure "as it starts (glibc without fast bins, one arena)"
measure "glibc at its defaults" GLIBC_TUNABLES=glibc.malloc.check=0
