#!/usr/bin/env bash
# What a stalled TLS handshake holds in the gateway, for two binaries side by side: N
# connections each stop inside a ClientHello (announced at 60,000 bytes, sent in 4 KiB records)
# after BYTES bytes, and the gateway's resident memory grows by so much each.
#
#   loadtest/stalled-handshakes.sh OLD_BINARY NEW_BINARY [N] [OUT]
#                                  (defaults: 2000 target/stalled-handshakes.txt)
#
# Sizes tried: 2,000 bytes (a ClientHello), 8,000 (under the new cap) and 60,000 (under the
# 64 KiB rustls would join, past the new cap, which closes those connections at once).
set -euo pipefail
old=$1 new=$2 n=${3:-2000}
OUT=${4:-target/stalled-handshakes.txt}
cd "$(dirname "$0")/.."
PORT=17571 ADMIN=17572
work=$(mktemp -d)
trap 'pkill -f "idlegate serve --listen 127.0.0.1:17570" || true; rm -rf "$work"' EXIT
. loadtest/certs.sh
test_certs "$work"
rss() { awk '/VmRSS/ { print $2 * 1024 }' "/proc/$1/status"; }
mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/stalled-handshakes.sh $old $new $n"
  echo "# bytes binary still_open rss_per_connection_bytes"
  for size in 2000 8000 60000; do
    for which in old new; do
      bin=$old
      [ "$which" = new ] && bin=$new
      "$bin" serve --listen 127.0.0.1:17570 --tls-listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
        --tls-cert "$work/gateway.pem" --tls-key "$work/gateway.key" --login-timeout 60s \
        --max-pending-logins $((n + 100)) --max-pending-logins-per-ip $((n + 100)) >/dev/null 2>&1 &
      gw=$!
      for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$ADMIN") 2>/dev/null && break
        sleep 0.1
      done
      sleep 1
      before=$(rss "$gw")
      python3 loadtest/stalled-handshakes.py 127.0.0.1 "$PORT" "$n" "$size" 4 >"$work/open" &
      load=$!
      sleep 3
      after=$(rss "$gw")
      wait "$load"
      kill "$gw"
      wait "$gw" 2>/dev/null || true
      echo "$size $which $(cat "$work/open") $(((after - before) / n))"
    done
  done
} | tee "$OUT"
