#!/usr/bin/env bash
# The worst tick, measured: half the clients fall silent at the same moment, so one sweep
# expires all of them while the other half keeps pinging every second.
#
#   loadtest/mass-expiry.sh [connections] [runs] [out dir]
#                                  (defaults: 19000 3 target/mass-expiry; about a minute a run)
#
# idlegate (timeout 10 s, tick 1 s) runs pinned to core SERVER_CPU (default 0); the clients
# run on core LOAD_CPU (default 1) as two loadtest processes sharing one run: "active" (half
# the clients, pinging every second) and "silent" (the other half, falling silent together
# after a last PING). Two processes, because one would queue the active clients' PONGs
# behind its own handling of thousands of BYEs and closes, and measure itself; the silent
# one runs at nice 19, so its burst of closes does not hold the active one off the core
# either (the BYEs' timing is measured in the gateway, not by it). IDLEGATE names the
# gateway binary (default target/release/idlegate), for a before/after comparison.
#
# Per run N, writes <out dir>/N/{active,silent}.{json,txt}, gateway.log and metrics.txt (the
# gateway's /metrics after the sweep, with idlegate_expiry_bye_delay_seconds: from the tick
# that expired a session to its BYE written). Then loadtest/mass-expiry-summary.py prints,
# per run and as medians: the active clients' round-trip p99 in the seconds around the
# sweep, the expired clients' checks, and how long after its tick each BYE left.
# Everything runs on 127.0.0.1-127.0.0.8 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
CONNECTIONS=${1:-19000}
RUNS=${2:-3}
OUT=${3:-target/mass-expiry}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT=17080
ADMIN=17081
HALF=$((CONNECTIONS / 2))
IDLEGATE=${IDLEGATE:-target/release/idlegate}
command -v taskset >/dev/null || { echo "mass-expiry.sh: needs taskset (apt-get install util-linux)" >&2; exit 2; }
command -v curl >/dev/null || { echo "mass-expiry.sh: needs curl (apt-get install curl)" >&2; exit 2; }

echo "== building (release)"
cargo build --release -q -p idlegate -p loadtest --bins
rm -rf "$OUT"

for n in $(seq 1 "$RUNS"); do
  dir="$OUT/$n"
  mkdir -p "$dir"
  echo "== run $n: $HALF of $CONNECTIONS silent at once"
  taskset -c "$SERVER_CPU" "$IDLEGATE" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
    --timeout 10s --tick 1s 2>"$dir/gateway.log" &
  pid=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$ADMIN/healthz" >/dev/null && break
    sleep 0.1
  done
  # Silent at half the duration (12 s), swept 10 s later; 2 s of pinging after the sweep.
  common=(--target "127.0.0.1:$PORT" --admin "127.0.0.1:$ADMIN" --connections "$HALF" --connect-rate 2500
    --ping-interval 1s --duration 24s --shared-dir "$dir/shared" --processes 2)
  taskset -c "$LOAD_CPU" target/release/loadtest "${common[@]}" --uid-base 1 --seed 1 --silent-fraction 0 \
    --source-ips 127.0.0.1-127.0.0.4 --report "$dir/active.json" >"$dir/active.txt" 2>&1 &
  active=$!
  taskset -c "$LOAD_CPU" nice -n 19 target/release/loadtest "${common[@]}" --uid-base $((1 + HALF)) --seed 2 \
    --silent-fraction 1 --silent-together \
    --source-ips 127.0.0.5-127.0.0.8 --report "$dir/silent.json" >"$dir/silent.txt" 2>&1 &
  silent=$!
  [ -n "${SAMPLER:-}" ] && python3 "$SAMPLER" "$dir/cpu.txt" "$pid" "$active" "$silent" &
  wait "$active" || true
  wait "$silent" || true
  curl -sf "http://127.0.0.1:$ADMIN/metrics" >"$dir/metrics.txt"
  kill "$pid"
  wait "$pid" || true
  rm -rf "$dir/shared"
done

python3 loadtest/mass-expiry-summary.py "$OUT" | tee "$OUT/summary.txt"
