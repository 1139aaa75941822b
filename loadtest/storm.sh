#!/usr/bin/env bash
# Drain at scale and the reconnect storm after it, in one run:
#   1. a gateway with CONNECTIONS clients (default 19000), every one pinging;
#   2. SIGTERM: every client must get BYE(shutdown), with a retry hint, and the gateway must
#      exit 0 within --drain-timeout (the time is measured here);
#   3. a new gateway on the same port at once; every client comes back after its retry hint
#      (loadtest --reconnect): the report gives re-login p50/p99, the time until all are back,
#      what was shed, and --check fails on any false expiry or unexpected close.
#
# With SIGNAL=KILL the first gateway dies without a word instead: no BYE, no hint, every
# client sees its connection drop and comes back after 1-3 s, all at once; the worst storm.
#
# With TRANSPORT=tls (or ws, wss) the clients come in by that door, trusting a test CA made
# here with openssl: after a restart every TLS client pays a handshake again (a resumed one,
# with the ticket of its first session, when the new gateway can read it: tickets are keyed
# per process, so after a restart they are full handshakes).
#
# The clients come back by the Rust client library's policy (POLICY=library, the default:
# full-jitter backoff, never sooner than the hint), or as a fleet without jitter
# (POLICY=fixed: 1 s after every loss, hints ignored, as MQTT.js or Phoenix clients do).
# The report counts reconnect attempts per 100 ms; loadtest/storm-compare.sh runs both and
# draws them side by side.
#
# GATEWAY_ARGS and CLIENT_ARGS add flags to both gateways and to the load generator (the
# tokens of loadtest/storm-jwt.sh: --jwt-key-file, --token-file).
#
#   loadtest/storm.sh [CONNECTIONS] [OUT_PREFIX] [SIGNAL]     # about 90 s
set -uo pipefail
connections=${1:-19000}
out=${2:-docs/results/storm-$connections}
signal=${3:-TERM}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
transport=${TRANSPORT:-tcp}
policy=${POLICY:-library}
cargo build --release -q --workspace
mkdir -p "$(dirname "$out")"
door=(--listen 127.0.0.1:7270)
client=()
read -ra gateway_args <<<"${GATEWAY_ARGS:-}"
read -ra client_args <<<"${CLIENT_ARGS:-}"
# The first ramp is set-up, not the storm: TLS clients come in at a rate one core of each
# side keeps up with (a full handshake costs far more than a TCP connect), and the restart
# waits until they are all in.
rate=5000
settle=20
if [ "$transport" != tcp ]; then
  certs=$(mktemp -d)
  trap 'rm -rf "$certs"' EXIT
  . loadtest/certs.sh
  test_certs "$certs"
  door=(--listen 127.0.0.1:7280 "--$transport-listen" 127.0.0.1:7270 --tls-cert "$certs/gateway.pem" --tls-key "$certs/gateway.key")
  client=(--transport "$transport" --tls-ca "$certs/ca.pem")
  case "$transport" in tls | wss)
    rate=${TLS_CONNECT_RATE:-800}
    settle=35
    ;;
  esac
fi

# Starts a gateway in the background; its pid goes to $pid (no subshell: we wait on it).
gateway() {
  target/release/idlegate serve "${door[@]}" "${gateway_args[@]}" --admin-listen 127.0.0.1:7271 \
    --api-listen 127.0.0.1:7272 --drain-timeout 10s >"${TMPDIR:-/tmp}/storm-gateway-$1.log" 2>&1 &
  pid=$!
}

gateway 1
first=$pid
sleep 1
target/release/loadtest --target 127.0.0.1:7270 --connections "$connections" --connect-rate "$rate" \
  --ping-interval 10s --silent-fraction 0 --duration "$((settle + 50))s" --source-ips 127.0.0.1-127.0.0.4 \
  --reconnect --reconnect-policy "$policy" --admin http://127.0.0.1:7271 --report "$out.json" --check "${client[@]}" "${client_args[@]}" >"$out.txt" 2>"$out.progress" &
harness=$!

sleep "$settle"
start=$(date +%s%N)
kill -"$signal" "$first"
wait "$first"
status=$?
drained_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$signal" = KILL ] && status=0  # killed on purpose
gateway 2
second=$pid

wait "$harness"
verdict=$?
kill -TERM "$second"
wait "$second"
{
  echo "drain        SIG$signal with $connections clients: gateway exited (status $status) after $drained_ms ms"
  echo "loadtest     --check exit status $verdict"
} >>"$out.txt"
cat "$out.txt"
[ "$status" -eq 0 ] && [ "$verdict" -eq 0 ]
