#!/usr/bin/env bash
# System calls per PING of idlegate's MQTT door and of Mosquitto, counted by `strace -c -f`
# over the same fixed MQTT workload (loadtest/pings.py): exact counts, where callgrind
# (loadtest/ping-instructions.sh) sees only user space.
#
#   loadtest/ping-syscalls.sh [connections] [pings] [out file]
#                             (defaults: 20 200 target/ping-syscalls.txt; under a minute)
#
# Each server runs twice under strace: once while the clients log in and close, once while
# they also send `pings` rounds of one PINGREQ each; the difference over connections x pings
# is one PING's system calls, by call.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNECTIONS=${1:-20}
PINGS=${2:-200}
OUT=${3:-target/ping-syscalls.txt}
command -v strace >/dev/null || { echo "ping-syscalls.sh: needs strace (apt-get install strace)" >&2; exit 2; }
cargo build --release -q -p idlegate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
printf '%s\n' "listener 17185 127.0.0.1" "allow_anonymous true" "persistence false" "log_dest none" \
  "user root" >"$work/mosquitto.conf"

# trace SERVER PINGS: strace's table for the workload, in $work/SERVER.PINGS.
trace() {
  local server=$1 pings=$2 port pattern
  if [ "$server" = mosquitto ]; then
    port=17185 pattern="mosquitto -c $work/mosquitto.conf"
    strace -c -f -o "$work/$server.$pings" "$MOSQUITTO" -c "$work/mosquitto.conf" >/dev/null 2>&1 &
  else
    port=17184 pattern="idlegate serve --listen 127.0.0.1:17183"
    strace -c -f -o "$work/$server.$pings" target/release/idlegate serve --listen 127.0.0.1:17183 \
      --mqtt-listen 127.0.0.1:17184 --admin-listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --timeout 600s \
      --tick 10s >/dev/null 2>&1 &
  fi
  local pid=$!
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  python3 loadtest/pings.py mqtt "$port" "$CONNECTIONS" "$pings"
  # The server, not strace: strace reports once its tracee has exited.
  pkill -TERM -f "$pattern"
  wait "$pid" || true
}

# calls FILE: "name count" per system call in strace's table.
calls() { awk '$NF != "total" && $1 ~ /^[0-9.]+$/ { print $NF, $4 }' "$1"; }

mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/ping-syscalls.sh $CONNECTIONS $PINGS: system calls per PING (strace -c -f, with pings minus without)"
  for server in idlegate mosquitto; do
    trace "$server" 0
    trace "$server" "$PINGS"
    join -a 2 -e 0 -o 0,1.2,2.2 <(calls "$work/$server.0" | sort) <(calls "$work/$server.$PINGS" | sort) |
      awk -v s="$server" -v n=$((CONNECTIONS * PINGS)) '
        { per = ($3 - $2) / n; if (per > 0.005) { printf "%s %-16s %.3f\n", s, $1, per; total += per } }
        END { printf "%s %-16s %.3f\n", s, "TOTAL", total }'
  done
} | tee "$OUT"
