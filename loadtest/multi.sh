#!/usr/bin/env bash
# Several loadtest processes sharing one run, then one merged report.
#
#   loadtest/multi.sh <processes> <connections in all> <out dir> [loadtest flags...]
#
# One process holds at most about 19,000 sockets on this machine (20,000 open files each),
# so a run larger than that takes several. Process i (from 0) runs connections/processes
# clients with uids from UID_BASE + i * connections/processes (UID_BASE defaults to 1),
# connects from its own loopback addresses (127.0.<i+1>.1-127.0.<i+1>.4, so no two share
# ephemeral ports), uses seed i + 1, and waits for the others at the end through
# <out dir>/shared (see loadtest --shared-dir), so the gateways' online count is read
# while every client is connected. The flags after the out dir go to every process
# (--target, --admin, --api, --duration, --ping-interval, ...; not --connections,
# --uid-base, --seed, --source-ips or --report, which this script sets).
#
# Writes <out dir>/part-<i>.json and .txt (each process's report and output) and
# <out dir>/merged.json, merged.txt and merged.svg (loadtest --merge). With --check among
# the flags, exits 1 unless the merged run is clean.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
[ $# -ge 3 ] || usage
PROCESSES=$1
CONNECTIONS=$2
OUT=$3
shift 3
UID_BASE=${UID_BASE:-1}
LOADTEST=${LOADTEST:-target/release/loadtest}
if [ "$PROCESSES" -lt 1 ] || [ $((CONNECTIONS % PROCESSES)) -ne 0 ]; then
  echo "multi.sh: <connections in all> ($CONNECTIONS) must split evenly over <processes> ($PROCESSES)" >&2
  exit 2
fi
PER=$((CONNECTIONS / PROCESSES))
CHECK=()
for flag in "$@"; do
  if [ "$flag" = --check ]; then CHECK=(--check); fi
done
if [ ! -x "$LOADTEST" ]; then
  cargo build --release -q -p loadtest
fi

rm -rf "$OUT/shared"
mkdir -p "$OUT"
pids=()
for i in $(seq 0 $((PROCESSES - 1))); do
  "$LOADTEST" "$@" --connections "$PER" --uid-base $((UID_BASE + i * PER)) --seed $((i + 1)) \
    --source-ips "127.0.$((i + 1)).1-127.0.$((i + 1)).4" \
    --shared-dir "$OUT/shared" --processes "$PROCESSES" \
    --report "$OUT/part-$i.json" >"$OUT/part-$i.txt" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "multi.sh: process $i did not end clean; see $OUT/part-$i.txt" >&2
    status=1
  fi
done
parts=()
for i in $(seq 0 $((PROCESSES - 1))); do
  if [ -f "$OUT/part-$i.json" ]; then parts+=("$OUT/part-$i.json"); fi
done
if [ ${#parts[@]} -ne "$PROCESSES" ]; then
  echo "multi.sh: only ${#parts[@]} of $PROCESSES processes wrote a report" >&2
  exit 1
fi
"$LOADTEST" --merge "${parts[@]}" --report "$OUT/merged.json" --plot "$OUT/merged.svg" "${CHECK[@]}" \
  | tee "$OUT/merged.txt" || status=1
rm -rf "$OUT/shared"
exit $status
