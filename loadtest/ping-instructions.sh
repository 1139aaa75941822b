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
# callgrind does not see inside the kernel. Ticks are 10 s so the ticker adds (almost)
# nothing; each pair runs twice to show the counts repeat.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNECTIONS=${1:-20}
PINGS=${2:-200}
OUT=${3:-target/ping-instructions.txt}
command -v valgrind >/dev/null || { echo "ping-instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -q -p idlegate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. loadtest/certs.sh
test_certs "$work"
BASE=17170
declare -A PORT=([tcp]=$BASE [tls]=$((BASE + 1)) [ws]=$((BASE + 2)) [wss]=$((BASE + 3)) [mqtt]=$((BASE + 4))
  [mosquitto]=$((BASE + 5)))
DOORS=${DOORS:-tcp ws tls wss}
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
printf '%s\n' "listener ${PORT[mosquitto]} 127.0.0.1" "allow_anonymous true" "persistence false" \
  "log_dest none" "user root" >"$work/mosquitto.conf"

# count DOOR PINGS: the gateway's total instructions over the workload.
count() {
  local door=$1 pings=$2 file="$work/cg.$1.$2.$RANDOM"
  if [ "$door" = mosquitto ]; then
    valgrind --tool=callgrind --callgrind-out-file="$file" "$MOSQUITTO" -c "$work/mosquitto.conf" >/dev/null 2>&1 &
  else
    valgrind --tool=callgrind --callgrind-out-file="$file" target/release/idlegate serve \
      --listen "127.0.0.1:${PORT[tcp]}" --tls-listen "127.0.0.1:${PORT[tls]}" --ws-listen "127.0.0.1:${PORT[ws]}" \
      --wss-listen "127.0.0.1:${PORT[wss]}" --mqtt-listen "127.0.0.1:${PORT[mqtt]}" --tls-cert "$work/gateway.pem" \
      --tls-key "$work/gateway.key" --admin-listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --timeout 600s --tick 10s \
      >/dev/null 2>&1 &
  fi
  local pid=$!
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/${PORT[$door]}") 2>/dev/null && break
    sleep 0.1
  done
  local speaks=$door
  [ "$door" = mosquitto ] && speaks=mqtt
  python3 loadtest/pings.py "$speaks" "${PORT[$door]}" "$CONNECTIONS" "$pings" "$work/ca.pem"
  kill -TERM "$pid"
  wait "$pid" || true
  awk '/^summary:/ { print $2 }' "$file"
}

mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/ping-instructions.sh $CONNECTIONS $PINGS: gateway instructions (callgrind Ir)"
  echo "# door trial without_pings with_pings per_ping"
  for trial in 1 2; do
    for door in $DOORS; do
      without=$(count "$door" 0)
      with=$(count "$door" "$PINGS")
      echo "$door $trial $without $with $(((with - without) / (CONNECTIONS * PINGS)))"
    done
  done
} | tee "$OUT"
