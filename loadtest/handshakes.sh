#!/usr/bin/env bash
# TLS handshakes per second of one core's CPU, full and resumed, on the gateway's TLS door.
#
#   loadtest/handshakes.sh [seconds] [out file]      (defaults: 10 target/handshakes.txt)
#
# The gateway runs pinned to SERVER_CPU (default 0); `openssl s_time` on LOAD_CPU (default 1)
# opens connections one after another for `seconds`: with -new each pays a full handshake
# (ECDHE P-256 and an ECDSA P-256 signature here), with -reuse each resumes the first
# session. The figure is connections over the gateway's own CPU seconds (from /proc), so it
# is what one core of the gateway sustains whatever the client's speed; for TLS 1.3 and 1.2.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_=${1:-10}
OUT=${2:-target/handshakes.txt}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT=17370
CLK_TCK=$(getconf CLK_TCK)
command -v taskset >/dev/null || { echo "handshakes.sh: needs taskset (apt-get install util-linux)" >&2; exit 2; }
cargo build --release -q -p idlegate
work=$(mktemp -d)
. loadtest/certs.sh
test_certs "$work"
taskset -c "$SERVER_CPU" target/release/idlegate serve --listen 127.0.0.1:$((PORT + 1)) --tls-listen "127.0.0.1:$PORT" \
  --tls-cert "$work/gateway.pem" --tls-key "$work/gateway.key" --admin-listen 127.0.0.1:$((PORT + 2)) \
  --api-listen 127.0.0.1:$((PORT + 3)) 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done
cpu() { awk -v t="$CLK_TCK" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$pid/stat"; }

mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/handshakes.sh $SECONDS_: TLS handshakes per second of the gateway's CPU (openssl s_time)"
  for version in -tls1_3 -tls1_2; do
    for mode in -new -reuse; do
      before=$(cpu)
      line=$(taskset -c "$LOAD_CPU" openssl s_time -connect "127.0.0.1:$PORT" "$version" "$mode" \
        -time "$SECONDS_" -CAfile "$work/ca.pem" 2>/dev/null | grep -m1 "connections in .* real seconds" || true)
      after=$(cpu)
      conns=$(echo "$line" | awk '{ print $1 }')
      awk -v v="$version" -v m="$mode" -v c="${conns:-0}" -v b="$before" -v a="$after" -v l="$line" 'BEGIN {
        cpu = a - b; printf "%s %s: %s; gateway cpu %.2f s: %.0f handshakes per cpu second\n", v, m, l, cpu, (cpu > 0 ? c / cpu : 0) }'
    done
  done
} | tee "$OUT"
