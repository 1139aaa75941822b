#!/usr/bin/env bash
# Two gateway binaries under the same ping load, interleaved (A B A B ...), so a change's cost
# per PING and per connection is read side by side in one sitting.
#
#   loadtest/before-after.sh OLD_BINARY NEW_BINARY [ROUNDS] [CONNECTIONS]
#
# Build the old binary from any commit, e.g.
#   git worktree add /tmp/old <commit> && (cd /tmp/old && cargo build --release -p idlegate)
# Each run: CONNECTIONS clients (default 19000) ping every second for 30 s; prints the
# gateway's CPU per PONG and resident memory per connection, one line per run.
#
# The gateway runs pinned to one core (SERVER_CPU, default 0) and the load generator to the
# other (LOAD_CPU, default 1), so neither takes CPU from the other.
#
# NEW_PAGES=N holds N status pages open (loadtest/pages.py) during the "new" runs only:
# with the same binary on both sides, that is what open pages cost.
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} connections=${4:-19000}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p loadtest --manifest-path "$root/Cargo.toml"
loadtest=$root/target/release/loadtest
tmp=$(mktemp -d)
trap 'pkill -f "idlegate serve --listen 127.0.0.1:7170" || true; rm -rf "$tmp"' EXIT
for round in $(seq "$rounds"); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    # The API address goes by environment, which a binary from before the API ignores.
    IDLEGATE_API_LISTEN=127.0.0.1:7172 taskset -c "$SERVER_CPU" "$bin" serve --listen 127.0.0.1:7170 --admin-listen 127.0.0.1:7171 \
      >/dev/null 2>&1 &
    gw=$!
    sleep 1
    viewer=
    if [ "$which" = new ] && [ "${NEW_PAGES:-0}" -gt 0 ]; then
      python3 "$root/loadtest/pages.py" 127.0.0.1:7171 "$NEW_PAGES" &
      viewer=$!
      sleep 2
    fi
    taskset -c "$LOAD_CPU" "$loadtest" --target 127.0.0.1:7170 --connections "$connections" --connect-rate 5000 --ping-interval 1s \
      --silent-fraction 0 --duration 30s --source-ips 127.0.0.1-127.0.0.4 --admin http://127.0.0.1:7171 \
      --report "$tmp/$which-$round.json" >/dev/null 2>&1 || true
    if [ -n "$viewer" ]; then kill "$viewer"; fi
    kill "$gw"; wait "$gw" 2>/dev/null || true
    python3 - "$tmp/$which-$round.json" "$round" "$which" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("round %s %-3s pongs %d cpu %.2f s cpu_us_per_pong %.2f rss_per_conn %.0f rtt_p99 %.2f ms" % (
    sys.argv[2], sys.argv[3], r["pongs_received"], r["gateway_cpu_seconds"],
    r["gateway_cpu_seconds"] * 1e6 / max(r["pongs_received"], 1),
    r["gateway_rss_bytes_per_connection"] or 0, r["rtt_ms"]["p99"]))
PY
  done
done
