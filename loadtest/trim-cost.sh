#!/usr/bin/env bash
# What trimming the cluster's event stream costs Redis: Redis's CPU per script call
# (`INFO commandstats`, EVALSHA) for one gateway's logins and logouts below the stream's
# caps, at its count cap, and at its byte cap with 16 KiB DATA frames. Each gateway binary
# given runs the same three workloads on a fresh redis-server, one after another, so the
# figures compare side by side (docs/BENCHMARKS.md, "Trimming the shared stream").
#
#   loadtest/trim-cost.sh OUT_DIR LABEL=GATEWAY_BINARY [LABEL=GATEWAY_BINARY ...]
#
# Writes OUT_DIR/<label>-<case>.txt (Redis's commandstats after the measured part, then
# the events logged in it and the stream's length) and prints a table: case, label,
# EVALSHA calls, usec per call, usec per event logged. The cases: `below` (logins and
# logouts, both caps far), `count` (the same at a cap of 1,000 events), `data` (16 KiB
# DATA frames, both caps far) and `bytes` (the same at a cap of 1 MiB). Needs redis-server
# and redis-cli; loopback only; under a minute per binary.
#
# CASES="below count" runs only those cases (all four by default).
#
# INSTRUCTIONS=1 runs redis-server under valgrind's callgrind, counting only the measured
# part, and adds its instructions per event: a count that repeats exactly, where Redis's
# own timings (wall clock, on a shared machine) cannot tell 10 % apart. Several minutes.
set -euo pipefail
out=${1:?usage: trim-cost.sh OUT_DIR LABEL=BINARY ...}
shift
mkdir -p "$out"
# The workloads: cycles of LOGIN, LOGOUT (four events each), or 16 KiB DATA frames.
CYCLES=${CYCLES:-5000}
DATA_FRAMES=${DATA_FRAMES:-400}

drive() { # port mode count
  python3 - "$@" <<'PY'
import socket, struct, sys
port, mode, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def frame(kind, p=b""):
    return struct.pack(">IB", 1 + len(p), kind) + p
def recv(s):
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return s.recv(n, socket.MSG_WAITALL)
if mode == "cycles":
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(frame(0x01, struct.pack(">Q", 1000 + i % 500)))
        recv(s)
        s.sendall(frame(0x04))
        recv(s)
        s.close()
else:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(frame(0x01, struct.pack(">Q", 7)))
    recv(s)
    payload = b"x" * 16384
    for i in range(count):
        s.sendall(frame(0x03, payload))
        if i % 20 == 19:
            s.sendall(frame(0x02, b"sync"))
            recv(s)
    s.sendall(frame(0x04))
    recv(s)
PY
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until the stream has logged `n` events in all.
logged() { # redis_port n
  for _ in $(seq 600); do
    got=$(redis-cli -p "$1" HGET '{idlegate}:events:last' n)
    [ "${got:-0}" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "the stream did not reach $2 events" >&2
  return 1
}

run_case() { # label binary case capacity bytes
  local label=$1 bin=$2 case=$3 capacity=$4 bytes=$5
  local dir rport gport aport pport
  dir=$(mktemp -d)
  rport=$(port); gport=$(port); aport=$(port); pport=$(port)
  local valgrind=()
  if [ -n "${INSTRUCTIONS:-}" ]; then
    valgrind=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/callgrind.out")
  fi
  "${valgrind[@]}" redis-server --port "$rport" --dir "$dir" --save '' --appendonly no --daemonize no \
    >"$dir/redis.log" 2>&1 &
  local redis=$!
  until redis-cli -p "$rport" PING >/dev/null 2>&1; do sleep 0.1; done
  "$bin" serve --listen "127.0.0.1:$gport" --admin-listen "127.0.0.1:$aport" --api-listen "127.0.0.1:$pport" \
    --node-id trim --redis "redis://127.0.0.1:$rport" --event-log-capacity "$capacity" \
    --event-log-bytes "$bytes" --max-data-rate 100000 --max-data-burst 10000 >"$dir/gateway.log" 2>&1 &
  local gw=$!
  until curl -sf "http://127.0.0.1:$aport/readyz" >/dev/null; do sleep 0.05; done
  # Fill the stream to its cap first (every case but `below` sits at it), then measure.
  local before
  case $case in
    below | data) ;;
    count) drive "$gport" cycles 400 ;;
    bytes) drive "$gport" data 100 ;;
  esac
  local before events
  before=$(redis-cli -p "$rport" HGET '{idlegate}:events:last' n)
  redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
  [ -n "${INSTRUCTIONS:-}" ] && callgrind_control -i on "$redis" >/dev/null 2>&1
  if [ "$case" = bytes ] || [ "$case" = data ]; then
    drive "$gport" data "$DATA_FRAMES"
    events=$DATA_FRAMES
  else
    drive "$gport" cycles "$CYCLES"
    events=$((4 * CYCLES))
  fi
  logged "$rport" $((${before:-0} + events))
  local instructions=0
  if [ -n "${INSTRUCTIONS:-}" ]; then
    callgrind_control -i off "$redis" >/dev/null 2>&1
    callgrind_control -d "$redis" >/dev/null 2>&1
    sleep 1
    instructions=$(cat "$dir"/callgrind.out* | awk '/^summary:|^totals:/ { s += $2 } END { print s + 0 }')
  fi
  redis-cli -p "$rport" INFO commandstats | tr -d '\r' >"$out/$label-$case.txt"
  echo "instructions:$instructions" >>"$out/$label-$case.txt"
  echo "events_logged:$events" >>"$out/$label-$case.txt"
  echo "stream_length:$(redis-cli -p "$rport" XLEN '{idlegate}:events')" >>"$out/$label-$case.txt"
  kill "$gw" && wait "$gw" 2>/dev/null || true
  kill "$redis" && wait "$redis" 2>/dev/null || true
  rm -rf "$dir"
  local line
  line=$(grep '^cmdstat_evalsha:' "$out/$label-$case.txt")
  local calls usec per
  calls=$(sed 's/^[^:]*:calls=\([0-9]*\),.*/\1/' <<<"$line")
  usec=$(sed 's/.*,usec=\([0-9]*\),.*/\1/' <<<"$line")
  per=$(sed 's/.*usec_per_call=\([0-9.]*\).*/\1/' <<<"$line")
  printf '%-6s %-8s %7s calls %9s usec/call %8.1f usec/event %9.0f instructions/event\n' "$case" "$label" \
    "$calls" "$per" "$(echo "$usec / $events" | bc -l)" "$(echo "$instructions / $events" | bc -l)"
}

for pair in "$@"; do
  label=${pair%%=*}
  bin=${pair#*=}
  # Below both caps, then at the count cap; 16 KiB DATA below both caps, then at the byte cap.
  for case in ${CASES:-below count data bytes}; do
    case $case in
      below) run_case "$label" "$bin" below 1000000 1073741824 ;;
      count) run_case "$label" "$bin" count 1000 1073741824 ;;
      data) run_case "$label" "$bin" data 1000000 1073741824 ;;
      bytes) run_case "$label" "$bin" bytes 1000000 1048576 ;;
      *) echo "unknown case $case" >&2; exit 2 ;;
    esac
  done
done | tee "$out/summary.txt"
