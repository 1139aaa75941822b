#!/usr/bin/env bash
# What the cluster's users hash costs a uid in Redis, exactly (MEMORY USAGE, SAMPLES 0), for
# the value it held before issue 49's device bound (a count) and for the list it holds now
# (each session as `<epoch>|<member>|<session>|<device>`): 200,000 uids with one session
# each, written into a throwaway redis-server on a free loopback port.
#
#   loadtest/users-hash-memory.sh [uids, default 200000]
set -euo pipefail
UIDS=${1:-200000}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize yes \
  --pidfile "$dir/redis.pid" >/dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
fill() { # key, Lua expression of the value for uid i
  redis-cli -p "$port" eval "for i = 1, tonumber(ARGV[1]) do redis.call('HSET', KEYS[1], tostring(1000000 + i), $2) end return 1" 1 "$1" "$UIDS" >/dev/null
}
fill count "'1'"
fill short "'1764300000000|n1#1a2b3c4d|' .. string.format('%016x', i) .. '|'"
fill long "'1764300000000|gateway-eu-west-1b-07#1a2b3c4d|' .. string.format('%016x', i) .. '|phone'"
echo "$(redis-server --version)"
echo "uids $UIDS"
for k in count short long; do
  bytes=$(redis-cli -p "$port" memory usage "$k" samples 0)
  awk -v k="$k" -v b="$bytes" -v n="$UIDS" 'BEGIN { printf "%-6s %10d bytes %6.1f B a uid\n", k, b, b / n }'
done
