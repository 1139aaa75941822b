#!/usr/bin/env bash
# A cluster run on one machine: one Redis, NODES gateways joined through it, and PROCESSES
# loadtest processes sharing one run over all of them (loadtest/multi.sh).
#
#   loadtest/cluster.sh <out dir>
#
# Settings, from the environment (defaults in brackets):
#   NODES [3]  PROCESSES [3]  CONNECTIONS [57000]  CONNECT_RATE per process [1000]
#   DURATION [60s]  PING [10s]  SILENT [0.25]  TOGETHER [0: silent at random moments;
#   1: all silent at once, so one sweep expires them]  PUSH_RATE [0]  FOLLOW [0: 1 follows
#   and checks the event stream]  DEVICES [1: each uid on that many devices, the gateways at
#   --max-devices DEVICES; consecutive clients are one uid's devices, so they spread over
#   the nodes]  PAUSE_AT, PAUSE_FOR [none, 10: SIGSTOP Redis PAUSE_AT
#   seconds into the run, SIGCONT PAUSE_FOR seconds later]  KILL_AT [none: kill -9 the
#   last gateway KILL_AT seconds into the run; every client then connects to that one,
#   the others serve the admin and event checks, and loadtest runs with --node-loss, so
#   with FOLLOW=1 each of its sessions must end with one node_lost]
#
# Writes into <out dir>: part-*.json/.txt and merged.json/.txt/.svg (the loadtest reports),
# samples.csv (one line every 250 ms: Redis's own command count, and the gateways' summed
# Redis commands, round trips, expiries, frames, logins, online users and Redis-up flags),
# commandstats-start.txt and commandstats-end.txt (Redis's INFO commandstats), pause.txt
# (when Redis was stopped and continued), after.txt (what Redis and the gateways hold once
# the clients have gone), and summary.txt (loadtest/cluster-summary.py over all of it).
# Everything listens on 127.0.0.1 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
[ $# -eq 1 ] || usage
OUT=$1
NODES=${NODES:-3}
PROCESSES=${PROCESSES:-3}
CONNECTIONS=${CONNECTIONS:-57000}
CONNECT_RATE=${CONNECT_RATE:-1000}
DURATION=${DURATION:-60s}
PING=${PING:-10s}
SILENT=${SILENT:-0.25}
TOGETHER=${TOGETHER:-0}
PUSH_RATE=${PUSH_RATE:-0}
FOLLOW=${FOLLOW:-0}
DEVICES=${DEVICES:-1}
PAUSE_AT=${PAUSE_AT:-}
PAUSE_FOR=${PAUSE_FOR:-10}
KILL_AT=${KILL_AT:-}
REDIS_PORT=${REDIS_PORT:-17379}
BASE_PORT=17400

for tool in redis-server redis-cli curl; do
  command -v "$tool" >/dev/null || { echo "cluster.sh: needs $tool (apt-get install redis-server redis-tools curl)" >&2; exit 2; }
done
cargo build --release -q -p idlegate -p loadtest
rm -rf "$OUT"
mkdir -p "$OUT"
WORK=$(mktemp -d)
pids=()
cleanup() {
  kill -CONT "${redis_pid:-0}" 2>/dev/null || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
  --logfile "$WORK/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 1 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

targets=() admins=() apis=() gw_pids=()
for n in $(seq 1 "$NODES"); do
  port=$((BASE_PORT + 10 * n))
  target/release/idlegate serve --node-id "gw$n" --redis "redis://127.0.0.1:$REDIS_PORT" \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --api-listen "127.0.0.1:$((port + 2))" \
    --max-devices "$DEVICES" >"$WORK/gw$n.log" 2>&1 &
  pids+=($!)
  gw_pids+=($!)
  targets+=("127.0.0.1:$port") admins+=("127.0.0.1:$((port + 1))") apis+=("127.0.0.1:$((port + 2))")
done
join() { local IFS=,; echo "$*"; }
for a in "${admins[@]}"; do
  for _ in $(seq 1 100); do curl -sf "http://$a/readyz" >/dev/null && break; sleep 0.1; done
done
redis-cli -p "$REDIS_PORT" info commandstats >"$OUT/commandstats-start.txt"

# The sampler: Redis's count and the gateways' figures, every 250 ms, until stopped.
metric_sum() { # name, then metrics bodies on stdin
  awk -v m="$1" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%.0f", s }'
}
sample() {
  echo "unix_s,redis_commands,gw_redis_commands,gw_round_trips,expired,frames,logins,online,redis_up"
  while :; do
    now=$(date +%s.%N)
    # A Redis that does not answer (paused) or a gateway that does not leaves its fields
    # empty; it must not end the sampler (which inherits set -e and pipefail).
    redis=$(timeout 0.2 redis-cli -p "$REDIS_PORT" info stats 2>/dev/null \
      | awk -F: '/^total_commands_processed/ { gsub("\r", "", $2); print $2 }') || redis=
    bodies=$(for a in "${admins[@]}"; do curl -s --max-time 0.2 "http://$a/metrics" || true; done)
    printf '%s,%s' "$now" "${redis:-}"
    for m in idlegate_redis_commands_total idlegate_redis_round_trips_total idlegate_ring_expired_total \
      idlegate_frames_received_total idlegate_logins_total idlegate_online_users idlegate_redis_up; do
      printf ',%s' "$(metric_sum "$m" <<<"$bodies")"
    done
    echo
    sleep 0.25
  done
}
sample >"$OUT/samples.csv" &
sampler=$!
pids+=("$sampler")

if [ -n "$PAUSE_AT" ]; then
  (
    sleep "$PAUSE_AT"
    echo "stop $(date +%s.%N)" >>"$OUT/pause.txt"
    kill -STOP "$redis_pid"
    sleep "$PAUSE_FOR"
    kill -CONT "$redis_pid"
    echo "cont $(date +%s.%N)" >>"$OUT/pause.txt"
  ) &
  pids+=($!)
fi

if [ -n "$KILL_AT" ]; then
  # Clients all on the last gateway, which dies; the others watch.
  victim=${gw_pids[-1]}
  (
    sleep "$KILL_AT"
    kill -KILL "$victim"
    echo "killed gw$NODES (pid $victim) $(date +%s.%N)" >>"$OUT/kill.txt"
  ) &
  pids+=($!)
  client_targets=("${targets[-1]}")
  admins=("${admins[@]:0:$((NODES - 1))}")
  apis=("${apis[@]:0:$((NODES - 1))}")
else
  client_targets=("${targets[@]}")
fi
flags=(--target "$(join "${client_targets[@]}")" --admin "$(join "${admins[@]}")" --connect-rate "$CONNECT_RATE"
  --duration "$DURATION" --ping-interval "$PING" --silent-fraction "$SILENT" --devices "$DEVICES" --check)
[ "$TOGETHER" = 1 ] && flags+=(--silent-together)
[ "$PUSH_RATE" != 0 ] && flags+=(--api "$(join "${apis[@]}")" --push-rate "$PUSH_RATE")
[ "$FOLLOW" = 1 ] && flags+=(--api "$(join "${apis[@]}")" --follow-events)
[ -n "$KILL_AT" ] && flags+=(--node-loss)
echo "start $(date +%s.%N) nodes $NODES processes $PROCESSES connections $CONNECTIONS flags ${flags[*]}" >"$OUT/run.txt"
verdict=0
loadtest/multi.sh "$PROCESSES" "$CONNECTIONS" "$OUT" "${flags[@]}" || verdict=$?
echo "end $(date +%s.%N) multi.sh exit status $verdict" >>"$OUT/run.txt"

# Once the clients have gone, nobody may look online: not in any gateway, not in Redis.
sleep 3
kill "$sampler" 2>/dev/null || true
{
  online=0
  for a in "${apis[@]}"; do
    online=$((online + $(curl -s "http://$a/v1/online" | python3 -c 'import json, sys; print(json.load(sys.stdin)["local"]["online"])')))
  done
  echo "gateways_online $online"
  echo "redis_routes $(redis-cli -p "$REDIS_PORT" --scan --pattern 'idlegate:route:*' | grep -c . || true)"
  sessions=0
  for key in $(redis-cli -p "$REDIS_PORT" --scan --pattern '{idlegate}:sessions:*'); do
    sessions=$((sessions + $(redis-cli -p "$REDIS_PORT" hlen "$key")))
  done
  echo "redis_sessions $sessions"
  echo "redis_events $(redis-cli -p "$REDIS_PORT" xlen '{idlegate}:events')"
  echo "redis_members $(redis-cli -p "$REDIS_PORT" smembers '{idlegate}:members' | tr '\n' ' ')"
  echo "redis_leases $(redis-cli -p "$REDIS_PORT" --scan --pattern '{idlegate}:lease:*' | grep -c . || true)"
  echo "redis_node_lost $(redis-cli -p "$REDIS_PORT" eval "local n = 0 for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do for i = 1, #e[2], 2 do if e[2][i] == 'r' and e[2][i + 1] == 'node_lost' then n = n + 1 end end end return n" 1 '{idlegate}:events')"
} >"$OUT/after.txt"
redis-cli -p "$REDIS_PORT" info commandstats >"$OUT/commandstats-end.txt"
python3 loadtest/cluster-summary.py "$OUT" | tee "$OUT/summary.txt"
exit "$verdict"
