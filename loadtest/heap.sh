#!/usr/bin/env bash
# Where a connection's memory goes: the gateway under heaptrack with N clients pinging every
# second, then its peak heap by allocation site.
#
#   loadtest/heap.sh [connections] [seconds] [out file]
#                                  (defaults: 19000 40 target/heap.txt; about a minute)
#
# Needs heaptrack (apt-get install heaptrack). The run lasts longer than the timeout (30 s),
# so every ring slot has been filled once. Writes the peak consumers (the first allocation
# site in idlegate, tokio's task or IO driver, dashmap or hashbrown for each) and heaptrack's
# totals to <out file>. Heap only: resident memory adds the allocator's own overhead, which
# compare.sh measures. PROTOCOL=mqtt has the clients speak MQTT 3.1.1 to the MQTT door
# (--mqtt-listen), as compare.sh's idlegate_mqtt does.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
CONNECTIONS=${1:-19000}
SECONDS_=${2:-40}
OUT=${3:-target/heap.txt}
PORT=17090
command -v heaptrack >/dev/null || { echo "heap.sh: needs heaptrack (apt-get install heaptrack)" >&2; exit 2; }
cargo build --profile profiling -q -p idlegate -p loadtest --bins
work=$(mktemp -d)
PROTOCOL=${PROTOCOL:-idlegate}
door=() target=$PORT speak=()
if [ "$PROTOCOL" = mqtt ]; then
  door=(--mqtt-listen "127.0.0.1:$((PORT + 1))") target=$((PORT + 1))
  speak=(--protocol mqtt --mqtt-keepalive 20s --mqtt-timeout 30s --mqtt-tick 1s)
fi
heaptrack -o "$work/gateway" target/profiling/idlegate serve --listen "127.0.0.1:$PORT" "${door[@]}" --timeout 30s \
  >/dev/null 2>&1 &
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$target") 2>/dev/null && break
  sleep 0.1
done
target/profiling/loadtest --target "127.0.0.1:$target" "${speak[@]}" --connections "$CONNECTIONS" --connect-rate 5000 \
  --silent-fraction 0 --ping-interval 1s --duration "${SECONDS_}s" --source-ips 127.0.0.1-127.0.0.4 >"$work/loadtest.txt" 2>&1
pkill -INT -f "idlegate serve --listen 127.0.0.1:$PORT"
while pgrep -f "idlegate serve --listen 127.0.0.1:$PORT" >/dev/null; do sleep 0.2; done
sleep 1
mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/heap.sh $CONNECTIONS $SECONDS_: peak heap by allocation site"
  heaptrack_print -f "$work"/gateway.*zst --print-peaks 1 --print-allocators 0 --print-temporary 0 \
    --print-leaks 0 --peak-limit 12 --sub-peak-limit 12 2>/dev/null |
    awk '/consumed over/ { if (hdr) print hdr " <- " first; hdr = $0; first = ""; next }
         /idlegate::|dashmap::|tokio::runtime::io|tokio::runtime::task::core|hashbrown/ && first == "" { first = $1 }
         END { print hdr " <- " first }' |
    sed 's/::h[0-9a-f]\{16\}//g; s/\$LT\$/</g; s/\$GT\$/>/g; s/\$C\$/,/g; s/\$u7b\$\$u7b\$closure\$u7d\$\$u7d\$/{closure}/g'
  heaptrack_print -f "$work"/gateway.*zst 2>/dev/null | tail -5
} >"$OUT"
rm -rf "$work"
cat "$OUT"
