#!/usr/bin/env bash
# What a hundred open status pages cost the gateway per PING: the same ping load (CONNECTIONS
# clients, each pinging every second for 30 s) with and without loadtest/pages.py running,
# interleaved (without, with, without, with, ...).
#
#   loadtest/pages-cost.sh [ROUNDS] [CONNECTIONS]      # about 80 s a round
set -uo pipefail
rounds=${1:-2}
connections=${2:-19000}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build --release -q --workspace
tmp=$(mktemp -d)
for round in $(seq "$rounds"); do
  for pages in 0 100; do
    target/release/idlegate serve --listen 127.0.0.1:7370 --admin-listen 127.0.0.1:7371 \
      --api-listen 127.0.0.1:7372 >/dev/null 2>&1 &
    gw=$!
    sleep 1
    viewer=
    if [ "$pages" -gt 0 ]; then
      python3 loadtest/pages.py 127.0.0.1:7371 "$pages" &
      viewer=$!
      sleep 2
    fi
    target/release/loadtest --target 127.0.0.1:7370 --connections "$connections" --connect-rate 5000 \
      --ping-interval 1s --silent-fraction 0 --duration 30s --source-ips 127.0.0.1-127.0.0.4 \
      --admin http://127.0.0.1:7371 --report "$tmp/$pages-$round.json" >/dev/null 2>&1
    [ -n "$viewer" ] && kill "$viewer"
    kill "$gw"; wait "$gw" 2>/dev/null
    python3 - "$tmp/$pages-$round.json" "$round" "$pages" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("round %s pages %3s: pongs %d cpu %.2f s cpu_us_per_pong %.2f rtt_p99 %.2f ms" % (
    sys.argv[2], sys.argv[3], r["pongs_received"], r["gateway_cpu_seconds"],
    r["gateway_cpu_seconds"] * 1e6 / max(r["pongs_received"], 1), r["rtt_ms"]["p99"]))
PY
  done
done
rm -rf "$tmp"
