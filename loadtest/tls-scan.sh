#!/usr/bin/env bash
# The TLS door as scanners see it: testssl.sh (Debian's testssl.sh) and sslyze (PyPI) against
# a gateway with a test certificate, their reports kept in OUT_DIR.
#
#   loadtest/tls-scan.sh [OUT_DIR]   (default docs/results/tls-scan)
#
# Needs: apt-get install testssl.sh; python3 -m pip install sslyze. A few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/results/tls-scan}
PORT=17671 ADMIN=17672
command -v testssl >/dev/null || command -v testssl.sh >/dev/null || { echo "needs testssl.sh" >&2; exit 2; }
python3 -c 'import sslyze' 2>/dev/null || { echo "needs sslyze (pip)" >&2; exit 2; }
cargo build --release -q -p idlegate --bin idlegate
work=$(mktemp -d)
trap 'kill "$gw" 2>/dev/null || true; rm -rf "$work"' EXIT
. loadtest/certs.sh
test_certs "$work"
target/release/idlegate serve --listen 127.0.0.1:17670 --tls-listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
  --tls-cert "$work/gateway.pem" --tls-key "$work/gateway.key" >/dev/null 2>&1 &
gw=$!
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done
mkdir -p "$OUT"
testssl=$(command -v testssl || command -v testssl.sh)
"$testssl" --quiet --color 0 --warnings off --openssl-timeout 10 "127.0.0.1:$PORT" >"$OUT/testssl.txt" 2>&1 || true
python3 -m sslyze "127.0.0.1:$PORT" >"$OUT/sslyze.txt" 2>&1 || true
echo "reports in $OUT: testssl.txt, sslyze.txt"
