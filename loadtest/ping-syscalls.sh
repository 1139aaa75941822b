#!/usr/bin/env bash
# System calls per PING of idlegate's MQTT door (mqtt) and of Mosquitto, counted by `strace -c -f`
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
. loadtest/ping-workload.sh

# calls FILE: "name count" per system call in strace's table.
calls() { awk '$NF != "total" && $1 ~ /^[0-9.]+$/ { print $NF, $4 }' "$1"; }

mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/ping-syscalls.sh $CONNECTIONS $PINGS: system calls per PING (strace -c -f, with pings minus without)"
  for server in mqtt mosquitto; do
    workload "$server" 0 strace -c -f -o "$work/$server.0"
    workload "$server" "$PINGS" strace -c -f -o "$work/$server.$PINGS"
    join -a 2 -e 0 -o 0,1.2,2.2 <(calls "$work/$server.0" | sort) <(calls "$work/$server.$PINGS" | sort) |
      awk -v s="$server" -v n=$((CONNECTIONS * PINGS)) '
        { per = ($3 - $2) / n; if (per > 0.005) { printf "%s %-16s %.3f\n", s, $1, per; total += per } }
        END { printf "%s %-16s %.3f\n", s, "TOTAL", total }'
  done
} | tee "$OUT"
