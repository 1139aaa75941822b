#!/usr/bin/env bash
# The loadtest's checks at full size on every door: for each of tcp, tls, ws and wss, a fresh
# gateway with every door open, and `connections` clients coming in by that door, a quarter
# of them falling silent, with pushes, DATA and the event consumer (`--check
# --follow-events`): the run fails if one client is expired falsely or late, one event is
# missing or repeated, or one push is lost.
#
#   loadtest/doors-check.sh [connections] [seconds] [out dir]
#                           (defaults: 19000 60 target/doors-check; about 8 minutes)
#
# DOORS (default "tcp tls ws wss") picks the doors; DEVICES (default 1) runs the gateway with
# --max-devices DEVICES and the clients with --devices DEVICES: each uid on that many devices,
# every push to a uid checked on all of them, and user_online/user_offline checked too.
#
# Gateway and load generator share the machine's two cores, unpinned. TLS clients come in at
# TLS_CONNECT_RATE (default 800) a second, the others at 5,000. Certificates come from a test
# CA made with openssl (loadtest/certs.sh). Writes <out dir>/<door>.txt (the loadtest's
# output) and <door>.json (its report); exits non-zero if a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNECTIONS=${1:-19000}
DURATION=${2:-60}
OUT=${3:-target/doors-check}
TLS_CONNECT_RATE=${TLS_CONNECT_RATE:-800}
DOORS=${DOORS:-tcp tls ws wss}
DEVICES=${DEVICES:-1}
BASE=17370
declare -A PORT=([tcp]=$BASE [tls]=$((BASE + 1)) [ws]=$((BASE + 2)) [wss]=$((BASE + 3)))
ADMIN=$((BASE + 4))
API=$((BASE + 5))
cargo build --release -q -p idlegate -p loadtest --bins
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'pkill -f "idlegate serve --listen 127.0.0.1:$BASE" || true; rm -rf "$work"' EXIT
. loadtest/certs.sh
test_certs "$work"
failed=0
for door in $DOORS; do
  target/release/idlegate serve --listen "127.0.0.1:${PORT[tcp]}" --tls-listen "127.0.0.1:${PORT[tls]}" \
    --ws-listen "127.0.0.1:${PORT[ws]}" --wss-listen "127.0.0.1:${PORT[wss]}" \
    --tls-cert "$work/gateway.pem" --tls-key "$work/gateway.key" \
    --admin-listen "127.0.0.1:$ADMIN" --api-listen "127.0.0.1:$API" \
    --max-pending-logins "$CONNECTIONS" --max-devices "$DEVICES" >"$OUT/$door.gateway.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$ADMIN") 2>/dev/null && break
    sleep 0.1
  done
  rate=5000
  [[ $door == tls || $door == wss ]] && rate=$TLS_CONNECT_RATE
  echo "== $door: $CONNECTIONS clients ($DEVICES per uid) at $rate a second, ${DURATION}s"
  if ! target/release/loadtest --target "127.0.0.1:${PORT[$door]}" --transport "$door" --tls-ca "$work/ca.pem" \
    --connections "$CONNECTIONS" --connect-rate "$rate" --ping-interval 10s --silent-fraction 0.25 \
    --duration "${DURATION}s" --source-ips 127.0.0.1-127.0.0.4 --admin "http://127.0.0.1:$ADMIN" \
    --api "http://127.0.0.1:$API" --push-rate 1000 --data-rate 0.1 --follow-events --devices "$DEVICES" \
    --report "$OUT/$door.json" --check >"$OUT/$door.txt" 2>&1; then
    echo "   check FAILED (see $OUT/$door.txt)"
    failed=1
  fi
  tail -n 12 "$OUT/$door.txt" | sed 's/^/   /'
  kill -INT "$pid"
  wait "$pid" || true
done
exit "$failed"
