#!/usr/bin/env bash
# A login storm with RS256 JWTs beside the same storm with idlegate's HMAC tokens, in one
# run: loadtest/storm.sh twice (CONNECTIONS clients logged in, SIGTERM, a new gateway at
# once, every client back after its retry hint), the gateway checking every client's token
# at each login. The JWTs are PyJWT's (loadtest/jwt-tokens.py: a 2048-bit RSA key, a JWKS,
# ~700-byte tokens with iss, aud and a few claims); the reports give the re-login p50/p99
# and the time until all are back, and the gateway's CPU time.
#
# The storm after a restart is paced by the retry hints, so it does not show how fast the
# gateway can check tokens. A second phase does: CONNECTIONS clients connecting as fast as
# the load generator can (--connect-rate 100000) to a fresh gateway, once with each kind of
# token; the login latency (connect to WELCOME) shows the queue the checks make.
#
#   loadtest/storm-jwt.sh [CONNECTIONS] [OUT_DIR]     # about 4 minutes
set -euo pipefail
connections=${1:-19000}
out=${2:-docs/results/jwt-storm}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 loadtest/jwt-tokens.py "$work" "$connections"
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
GATEWAY_ARGS="--auth-secret $secret" CLIENT_ARGS="--auth-secret $secret" \
  loadtest/storm.sh "$connections" "$out/hmac-$connections"
GATEWAY_ARGS="--jwt-key-file $work/jwks.json --jwt-issuer https://idp.example --jwt-audience idlegate --jwt-claims-to-events name,org" \
  CLIENT_ARGS="--token-file $work/tokens.txt" \
  loadtest/storm.sh "$connections" "$out/rs256-$connections"
# Phase 2: an unpaced login ramp against a fresh gateway, each kind of token in turn.
ramp() {
  local name=$1 gateway_flags=$2 client_flags=$3
  # shellcheck disable=SC2086
  target/release/idlegate serve --listen 127.0.0.1:7270 --admin-listen 127.0.0.1:7271 --api-listen 127.0.0.1:7272 \
    --max-pending-logins "$connections" --max-pending-logins-per-ip "$connections" $gateway_flags \
    >"${TMPDIR:-/tmp}/ramp-gateway-$name.log" 2>&1 &
  local pid=$!
  sleep 1
  # shellcheck disable=SC2086
  target/release/loadtest --target 127.0.0.1:7270 --connections "$connections" --connect-rate 100000 \
    --ping-interval 10s --silent-fraction 0 --duration 20s --source-ips 127.0.0.1-127.0.0.4 \
    --admin http://127.0.0.1:7271 --check $client_flags >"$out/ramp-$name-$connections.txt" 2>/dev/null || true
  kill -TERM "$pid"
  wait "$pid" || true
}
ramp hmac "--auth-secret $secret" "--auth-secret $secret"
ramp rs256 "--jwt-key-file $work/jwks.json --jwt-issuer https://idp.example --jwt-audience idlegate" \
  "--token-file $work/tokens.txt"
for run in hmac rs256; do
  echo "== storm, $run"
  grep -E '^(login|relogin|reconnect|gateway|drain|loadtest)' "$out/$run-$connections.txt" || true
  echo "== ramp, $run"
  grep -E '^(clients|login|gateway|result)' "$out/ramp-$run-$connections.txt" || true
done
