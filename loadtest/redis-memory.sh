#!/usr/bin/env bash
# What a cluster's sessions take in Redis, key by key: run while a loadtest/cluster.sh run
# holds its clients (loadtest/million.sh ran it at full load, into redis-memory.txt).
#
#   loadtest/redis-memory.sh [port, default 17379]
#
# Prints INFO memory, the key count, and MEMORY USAGE (exact: SAMPLES 0) of the users hash,
# of every member's sessions hash, of the event stream, and of the route keys (1,000 of
# them, sampled with SCAN, and their mean).
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
PORT=${1:-17379}
r() { redis-cli -p "$PORT" "$@"; }
echo "== at $(date +%s.%N)"
echo "== info memory"; r info memory | tr -d '\r' | grep -E '^(used_memory|used_memory_rss|used_memory_dataset|used_memory_overhead|mem_fragmentation_ratio):'
echo "== dbsize $(r dbsize)"
echo "== users hash: fields $(r hlen '{idlegate}:users') bytes $(r memory usage '{idlegate}:users' samples 0)"
for member in $(r smembers '{idlegate}:members'); do
  key="{idlegate}:sessions:$member"
  echo "== sessions hash $key: fields $(r hlen "$key") bytes $(r memory usage "$key" samples 0)"
done
echo "== events stream: entries $(r xlen '{idlegate}:events') bytes $(r memory usage '{idlegate}:events' samples 0)"
keys=$( (r --scan --pattern 'idlegate:route:*' || true) | head -1000)
awk '{ print "MEMORY USAGE " $1 " SAMPLES 0" }' <<<"$keys" | r \
  | awk '{ s += $1; n++ } END { printf "== route keys: %d sampled, %.1f bytes each on average\n", n, s / n }'
