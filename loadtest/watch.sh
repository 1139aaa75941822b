#!/usr/bin/env bash
# What watch lists cost one gateway (issue 52): `loadtest watch` against a release gateway
# with --watch-policy open, pinned apart (the gateway on SERVER_CPU, default 0; the
# harness on LOAD_CPU, default 1).
#
#   loadtest/watch.sh OUT_DIR [WATCHERS] [PER_WATCHER] [RATE]
#                     (defaults: 19000 200 50: 3.8 million watch entries, 50 changes a second)
#
# The harness's sessions send nothing but their WATCHes and STATUSes, so the gateway runs
# with --timeout 10m: the run's few minutes never expire a watcher, and the ring does no
# work beside the fan-out's.
#
# Writes OUT_DIR/report.json (the harness's figures: memory per watch entry, CPU per
# delivered change, change-to-watcher latency, the celebrity's change to its last watcher)
# and OUT_DIR/metrics-after.txt (the gateway's /metrics at the end), and OUT_DIR/command.
set -euo pipefail
out=$1 watchers=${2:-19000} per=${3:-200} rate=${4:-50}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
cd "$(dirname "$0")/.."
cargo build --release -q --bin idlegate
cargo build --release -q -p loadtest --bin loadtest
mkdir -p "$out"
echo "loadtest/watch.sh $out $watchers $per $rate  # at $(git describe --always --dirty)" >"$out/command"
taskset -c "$SERVER_CPU" target/release/idlegate serve --listen 127.0.0.1:7270 --admin-listen 127.0.0.1:7271 \
  --api-listen 127.0.0.1:7272 --watch-policy open --timeout 10m --log-format json \
  >"$out/gateway.log" 2>&1 &
gateway=$!
trap 'kill $gateway 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf http://127.0.0.1:7271/metrics >/dev/null && break; sleep 0.1; done
taskset -c "$LOAD_CPU" target/release/loadtest watch --addr 127.0.0.1:7270 --admin 127.0.0.1:7271 \
  --watchers "$watchers" --per-watcher "$per" --rate "$rate" --out "$out/report.json"
curl -sf http://127.0.0.1:7271/metrics >"$out/metrics-after.txt"
