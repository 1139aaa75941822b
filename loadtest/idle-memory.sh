#!/usr/bin/env bash
# Resident memory per idle connection on each door, for two gateway binaries side by side
# (A B A B ...), so a change's cost per connection is read in one sitting.
#
#   loadtest/idle-memory.sh OLD_BINARY NEW_BINARY [ROUNDS] [CONNECTIONS] [OUT]
#                            (defaults: 2 rounds, 10000 connections, target/idle-memory.txt)
#
# Build the old binary from any commit, e.g.
#   git worktree add /tmp/old <commit> && (cd /tmp/old && cargo build --release -p idlegate)
# Each run: one gateway with every door open on SERVER_CPU (default 0), CONNECTIONS clients
# of one door on LOAD_CPU (default 1) that log in and then send one PING (MQTT: PINGREQ)
# every 20 s, for 25 s: idle connections, each kept alive. One line per run: the door, the
# binary, and (resident memory at steady state - at start) / connections, from the
# loadtest's report. DOORS picks the doors (default tcp tls ws wss mqtt).
set -euo pipefail
old=$1 new=$2 rounds=${3:-2} connections=${4:-10000}
OUT=${5:-target/idle-memory.txt}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
DOORS=${DOORS:-tcp tls ws wss mqtt}
cd "$(dirname "$0")/.."
cargo build --release -q -p loadtest
BASE=17470
declare -A PORT=([tcp]=$BASE [tls]=$((BASE + 1)) [ws]=$((BASE + 2)) [wss]=$((BASE + 3)) [mqtt]=$((BASE + 4)))
ADMIN=$((BASE + 5))
work=$(mktemp -d)
trap 'pkill -f "idlegate serve --listen 127.0.0.1:$BASE" || true; rm -rf "$work"' EXIT
. loadtest/certs.sh
test_certs "$work"
mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/idle-memory.sh $old $new $rounds $connections"
  echo "# door round binary logins rss_per_connection_bytes"
  for round in $(seq "$rounds"); do
    for door in $DOORS; do
      for which in old new; do
        bin=$old
        [ "$which" = new ] && bin=$new
        taskset -c "$SERVER_CPU" "$bin" serve --listen "127.0.0.1:${PORT[tcp]}" --tls-listen "127.0.0.1:${PORT[tls]}" \
          --ws-listen "127.0.0.1:${PORT[ws]}" --wss-listen "127.0.0.1:${PORT[wss]}" --mqtt-listen "127.0.0.1:${PORT[mqtt]}" \
          --tls-cert "$work/gateway.pem" --tls-key "$work/gateway.key" --admin-listen "127.0.0.1:$ADMIN" \
          --max-pending-logins "$connections" >/dev/null 2>&1 &
        gw=$!
        for _ in $(seq 1 100); do
          (exec 3<>"/dev/tcp/127.0.0.1/$ADMIN") 2>/dev/null && break
          sleep 0.1
        done
        rate=5000 speak=(--transport "$door")
        [[ $door == tls || $door == wss ]] && rate=1000
        [ "$door" = mqtt ] && speak=(--protocol mqtt --mqtt-keepalive 20s --mqtt-timeout 30s --mqtt-tick 1s)
        taskset -c "$LOAD_CPU" target/release/loadtest --target "127.0.0.1:${PORT[$door]}" "${speak[@]}" \
          --tls-ca "$work/ca.pem" --connections "$connections" --connect-rate "$rate" --ping-interval 20s \
          --silent-fraction 0 --duration 25s --source-ips 127.0.0.1-127.0.0.4 --admin "http://127.0.0.1:$ADMIN" \
          --report "$work/report.json" >/dev/null 2>&1 || true
        kill "$gw"
        wait "$gw" 2>/dev/null || true
        python3 - "$work/report.json" "$door" "$round" "$which" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("%s %s %s %d %.0f" % (sys.argv[2], sys.argv[3], sys.argv[4], r["logins_ok"], r["gateway_rss_bytes_per_connection"] or 0))
PY
      done
    done
  done
} | tee "$OUT"
