#!/usr/bin/env bash
# Instructions the gateway spends per PING on each door, counted by callgrind: exact and
# repeatable whatever else the machine does, where wall-clock CPU cannot resolve 5 %.
#
#   loadtest/ping-instructions.sh [connections] [pings] [out file]
#                                 (defaults: 20 200 target/ping-instructions.txt; a few minutes)
#
# For each door (DOORS, default tcp ws tls wss; also mqtt, the MQTT door, and mosquitto,
# Debian's broker under the same MQTT workload) the server runs under `valgrind --tool=callgrind`
# twice: once while loadtest/pings.py logs `connections` clients in and closes them, once
# while it also sends `pings` rounds of one PING per client. The difference of the two
# totals over connections x pings is one PING's cost: read, decode (and decrypt, unmask),
# the ring touch, the PONG's encode (and encrypt), the write. User-space instructions only:
# the system calls are the same count on every door (one read, one write per PING), and
# callgrind does not see inside the kernel (loadtest/ping-syscalls.sh counts the calls).
# Each pair runs twice to show the counts repeat. A third run per door (DATA=1 to
# loadtest/pings.py) sends a 16-byte DATA before every PING: its difference from the run
# with pings alone, over connections x pings, is one DATA's cost (read, decode, the rate
# bucket, the event log; its PING then finds the ring touched on this tick already).
set -euo pipefail
cd "$(dirname "$0")/.."
CONNECTIONS=${1:-20}
PINGS=${2:-200}
OUT=${3:-target/ping-instructions.txt}
command -v valgrind >/dev/null || { echo "ping-instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
DOORS=${DOORS:-tcp ws tls wss}
. loadtest/ping-workload.sh

# count DOOR PINGS [DATA]: the server's total instructions over the workload (with a DATA
# before every PING when DATA is 1).
count() {
  local file="$work/cg.$1.$2.$RANDOM"
  DATA=${3:-0} workload "$1" "$2" valgrind --tool=callgrind --callgrind-out-file="$file"
  awk '/^summary:/ { print $2 }' "$file"
}

mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/ping-instructions.sh $CONNECTIONS $PINGS: gateway instructions (callgrind Ir)"
  echo "# door trial without_pings with_pings with_data per_ping per_data"
  for trial in 1 2; do
    for door in $DOORS; do
      without=$(count "$door" 0)
      with=$(count "$door" "$PINGS")
      data=$(count "$door" "$PINGS" 1)
      echo "$door $trial $without $with $data $(((with - without) / (CONNECTIONS * PINGS))) $(((data - with) / (CONNECTIONS * PINGS)))"
    done
  done
} | tee "$OUT"
