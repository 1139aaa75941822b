#!/usr/bin/env bash
# Timeout classes checked from outside: clients spread over five timeouts, from 10 s to
# 30 min, on one gateway with its default classes; a quarter of them fall silent, and each
# must be expired inside the window of the timeout its WELCOME granted (issue 50).
#
#   loadtest/classes-check.sh [connections] [out dir]
#                  (defaults: 19000 target/classes-check; about 33 minutes: the longest
#                   class's silent clients are due 30 minutes after they fall silent)
#
# Writes <out dir>/report.json and loadtest.txt (the per-class rows: logins, expired in
# window, missed, early, late, shortest and longest silence), gateway.log, and the gateway's
# /metrics once every client is in (metrics-steady.txt: sessions by timeout, memory) and at
# the end (metrics-end.txt: expiries by timeout, the sweep's duration per tick).
# Everything runs on 127.0.0.1-127.0.0.4 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
CONNECTIONS=${1:-19000}
OUT=${2:-target/classes-check}
PORT=17090
ADMIN=17091
command -v curl >/dev/null || { echo "classes-check.sh: needs curl (apt-get install curl)" >&2; exit 2; }

echo "== building (release)"
cargo build --release -q -p idlegate -p loadtest --bins
rm -rf "$OUT"
mkdir -p "$OUT"
target/release/idlegate serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" --tick 1s \
  --max-connections $((CONNECTIONS + 500)) 2>"$OUT/gateway.log" &
gateway=$!
trap 'kill $gateway 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$ADMIN/healthz" >/dev/null && break
  sleep 0.1
done
# Once every client is in and before the first long class expires: the steady picture.
(sleep 90 && curl -sf "http://127.0.0.1:$ADMIN/metrics" >"$OUT/metrics-steady.txt") &
status=0
target/release/loadtest --target "127.0.0.1:$PORT" --admin "127.0.0.1:$ADMIN" --connections "$CONNECTIONS" \
  --connect-rate 2000 --timeouts 10s,1m,5m,10m,30m --ping-interval 10s --silent-fraction 0.25 \
  --duration 60s --source-ips 127.0.0.1-127.0.0.4 --report "$OUT/report.json" --check \
  >"$OUT/loadtest.txt" 2>"$OUT/progress.txt" || status=$?
curl -sf "http://127.0.0.1:$ADMIN/metrics" >"$OUT/metrics-end.txt" || true
grep -E '^idlegate_(sessions_by_timeout|expired_by_timeout_total|ring_sweep_duration_seconds_(sum|count)|ring_expired_per_sweep_(sum|count))' \
  "$OUT/metrics-end.txt" >"$OUT/metrics-summary.txt" || true
cat "$OUT/loadtest.txt"
exit "$status"
