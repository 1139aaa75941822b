#!/usr/bin/env bash
# What trimming the cluster's event stream costs Redis: Redis's CPU per script call
# (`INFO commandstats`, EVALSHA) for one gateway's logins and logouts below the stream's
# caps, at its count cap, and at its byte cap with 16 KiB DATA frames. Each gateway binary
# given runs the same three workloads on a fresh redis-server, one after another, so the
# figures compare side by side (docs/BENCHMARKS.md, "Trimming the shared stream").
#
#   loadtest/trim-cost.sh OUT_DIR LABEL=GATEWAY_BINARY [LABEL=GATEWAY_BINARY ...]
#
# Writes OUT_DIR/<label>-<case>.txt (Redis's commandstats after the measured part) and
# prints a table: case, label, EVALSHA calls, usec per call. Needs redis-server and
# redis-cli; loopback only; about a minute per binary.
set -euo pipefail
out=${1:?usage: trim-cost.sh OUT_DIR LABEL=BINARY ...}
shift
mkdir -p "$out"
# The workloads: cycles of LOGIN, LOGOUT (four events each), or 16 KiB DATA frames.
CYCLES=${CYCLES:-2000}
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
  redis-server --port "$rport" --dir "$dir" --save '' --appendonly no --daemonize no >"$dir/redis.log" 2>&1 &
  local redis=$!
  until redis-cli -p "$rport" PING >/dev/null 2>&1; do sleep 0.05; done
  "$bin" serve --listen "127.0.0.1:$gport" --admin-listen "127.0.0.1:$aport" --api-listen "127.0.0.1:$pport" \
    --node-id trim --redis "redis://127.0.0.1:$rport" --event-log-capacity "$capacity" \
    --event-log-bytes "$bytes" --max-data-rate 100000 --max-data-burst 10000 >"$dir/gateway.log" 2>&1 &
  local gw=$!
  until curl -sf "http://127.0.0.1:$aport/readyz" >/dev/null; do sleep 0.05; done
  # Fill the stream to its cap first (every case but `below` sits at it), then measure.
  local before
  case $case in
    below) ;;
    count) drive "$gport" cycles 400 ;;
    bytes) drive "$gport" data 100 ;;
  esac
  before=$(redis-cli -p "$rport" HGET '{idlegate}:events:last' n)
  redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
  if [ "$case" = bytes ]; then
    drive "$gport" data "$DATA_FRAMES"
    logged "$rport" $((${before:-0} + DATA_FRAMES))
  else
    drive "$gport" cycles "$CYCLES"
    logged "$rport" $((${before:-0} + 4 * CYCLES))
  fi
  redis-cli -p "$rport" INFO commandstats | tr -d '\r' >"$out/$label-$case.txt"
  redis-cli -p "$rport" XLEN '{idlegate}:events' >>"$out/$label-$case.txt"
  kill "$gw" && wait "$gw" 2>/dev/null || true
  kill "$redis" && wait "$redis" 2>/dev/null || true
  rm -rf "$dir"
  local line
  line=$(grep '^cmdstat_evalsha:' "$out/$label-$case.txt")
  calls=$(sed 's/.*calls=\([0-9]*\).*/\1/' <<<"$line")
  per=$(sed 's/.*usec_per_call=\([0-9.]*\).*/\1/' <<<"$line")
  printf '%-6s %-10s %8s calls %10s usec/call\n' "$case" "$label" "$calls" "$per"
}

for pair in "$@"; do
  label=${pair%%=*}
  bin=${pair#*=}
  # Below both caps; at a cap of 1,000 events; at a byte cap of 1 MiB with 16 KiB DATA.
  run_case "$label" "$bin" below 1000000 1073741824
  run_case "$label" "$bin" count 1000 1073741824
  run_case "$label" "$bin" bytes 1000000 1048576
done | tee "$out/summary.txt"
