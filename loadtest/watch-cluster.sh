#!/usr/bin/env bash
# What watch lists cost a three-node cluster (issue 52): `loadtest watch` against three
# release gateways on one Redis, with --watch-policy open; the gateways and Redis on
# SERVER_CPU (default 0), the harness on LOAD_CPU (default 1), as loadtest/watch.sh pins
# the one gateway, so the two runs compare.
#
#   loadtest/watch-cluster.sh OUT_DIR [WATCHERS] [PER_WATCHER] [RATE]
#                     (defaults: 19000 200 50: 3.8 million watch entries over three nodes)
#
# Watcher w logs in on node w mod 3, changing uid i on node i mod 3: each change goes from
# its node through Redis (APPLY, the stream) to every node's fan-out. Writes OUT_DIR/
# report.json (memory and CPU summed over the three gateways), OUT_DIR/metrics-after-N.txt
# and OUT_DIR/command.
set -euo pipefail
out=$1 watchers=${2:-19000} per=${3:-200} rate=${4:-50}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
REDIS_PORT=${REDIS_PORT:-17479}
BASE_PORT=17500
cd "$(dirname "$0")/.."
for tool in redis-server redis-cli curl; do
  command -v "$tool" >/dev/null || { echo "watch-cluster.sh: needs $tool (apt-get install redis-server redis-tools curl)" >&2; exit 2; }
done
if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  echo "watch-cluster.sh: something answers on port $REDIS_PORT already (another run?)" >&2
  exit 2
fi
cargo build --release -q --bin idlegate
cargo build --release -q -p loadtest --bin loadtest
mkdir -p "$out"
echo "loadtest/watch-cluster.sh $out $watchers $per $rate  # at $(git describe --always --dirty)" >"$out/command"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
taskset -c "$SERVER_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" --logfile "$work/redis.log" &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
addrs=() admins=()
for n in 1 2 3; do
  port=$((BASE_PORT + 10 * n))
  env ${GATEWAY_ENV:-} taskset -c "$SERVER_CPU" target/release/idlegate serve --node-id "n$n" --redis "redis://127.0.0.1:$REDIS_PORT" \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --api-listen "127.0.0.1:$((port + 2))" \
    --watch-policy open --timeout 10m --log-format json >"$out/gateway-$n.log" 2>&1 &
  pids+=($!)
  addrs+=("127.0.0.1:$port") admins+=("127.0.0.1:$((port + 1))")
done
for a in "${admins[@]}"; do
  for _ in $(seq 100); do curl -sf "http://$a/readyz" >/dev/null && break; sleep 0.1; done
done
join() { local IFS=,; echo "$*"; }
taskset -c "$LOAD_CPU" target/release/loadtest watch --addr "$(join "${addrs[@]}")" --admin "$(join "${admins[@]}")" \
  --watchers "$watchers" --per-watcher "$per" --rate "$rate" --out "$out/report.json"
for n in 1 2 3; do
  curl -sf "http://${admins[$((n - 1))]}/metrics" >"$out/metrics-after-$n.txt"
done
