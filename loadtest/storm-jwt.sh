#!/usr/bin/env bash
# A login storm with RS256 JWTs beside the same storm with idlegate's HMAC tokens, in one
# run: loadtest/storm.sh twice (CONNECTIONS clients logged in, SIGTERM, a new gateway at
# once, every client back after its retry hint), the gateway checking every client's token
# at each login. The JWTs are PyJWT's (loadtest/jwt-tokens.py: a 2048-bit RSA key, a JWKS,
# ~700-byte tokens with iss, aud and a few claims); the reports give the re-login p50/p99
# and the time until all are back, which is where the signature checks show.
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
for run in hmac rs256; do
  echo "== $run"
  grep -E '^(relogin|reconnect|drain|loadtest)' "$out/$run-$connections.txt" || true
done
