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
#   with FOLLOW=1 each of its sessions must end with one node_lost]  LOSE_AT [none: kill -9
#   the last gateway LOSE_AT seconds into the run while the clients stay spread over every
#   node; loadtest runs with --node-loss, and a full-load snapshot of the machine is taken 5 s
#   before]  RECORD_EVENTS [0: 1 records the event stream from the first node into
#   events.jsonl, judged by loadtest verdict]  SAMPLE_EVERY [0.25 seconds]  SCRAPE [1s:
#   loadtest --scrape-interval]  GATEWAY_FLAGS [none: more flags for every gateway]
#   REDIS_NICE [none: Redis's nice value, -10 say, on a machine the run saturates]
#
# Writes into <out dir>: part-*.json/.txt and merged.json/.txt/.svg (the loadtest reports),
# samples.csv (one line every 250 ms: Redis's own command count, and the gateways' summed
# Redis commands, round trips, expiries, frames, logins, online users and Redis-up flags; then
# the gateways' summed RSS, Redis's CPU seconds, memory and stream length, the loadtest
# processes' RSS, the machine's used memory and slab, and TCP sockets in use), nodes.csv
# (each gateway's online sessions at the same moments), full-load.txt (with LOSE_AT:
# /proc/meminfo, /proc/slabinfo, sockstat and every process's RSS just before the kill;
# baseline.txt the same before the first client), kill.txt, gateway-warnings.txt (the
# gateways' warnings, counted by message), events.jsonl, recorder.txt (each time the
# recorder's connection ended and it resumed) and verdict.json (with RECORD_EVENTS=1),
# commandstats-start.txt and commandstats-end.txt (Redis's INFO commandstats), pause.txt
# (when Redis was stopped and continued), after.txt (what Redis and the gateways hold once
# the clients have gone), summary.txt (loadtest/cluster-summary.py over all of it) and
# cluster.svg (loadtest/cluster-plot.py: sessions, memory and events over the run).
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
LOSE_AT=${LOSE_AT:-}
RECORD_EVENTS=${RECORD_EVENTS:-0}
SAMPLE_EVERY=${SAMPLE_EVERY:-0.25}
SCRAPE=${SCRAPE:-1s}
GATEWAY_FLAGS=${GATEWAY_FLAGS:-}
REDIS_NICE=${REDIS_NICE:-}
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

# Another run's Redis on the port would be used by these gateways and then stopped with it.
if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  echo "cluster.sh: something answers on port $REDIS_PORT already (another run?)" >&2
  exit 2
fi
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
  --logfile "$WORK/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
# Sharing two cores with dozens of gateways and load generators, Redis must still answer
# within the gateways' 500 ms, or they count it away and their leases lapse.
[ -z "$REDIS_NICE" ] || renice -n "$REDIS_NICE" -p "$redis_pid" >/dev/null
for _ in $(seq 1 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

targets=() admins=() apis=() gw_pids=()
for n in $(seq 1 "$NODES"); do
  port=$((BASE_PORT + 10 * n))
  # shellcheck disable=SC2086
  target/release/idlegate serve --node-id "gw$n" --redis "redis://127.0.0.1:$REDIS_PORT" \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --api-listen "127.0.0.1:$((port + 2))" \
    --max-devices "$DEVICES" $GATEWAY_FLAGS >"$WORK/gw$n.log" 2>&1 &
  pids+=($!)
  gw_pids+=($!)
  targets+=("127.0.0.1:$port") admins+=("127.0.0.1:$((port + 1))") apis+=("127.0.0.1:$((port + 2))")
done
join() { local IFS=,; echo "$*"; }
for a in "${admins[@]}"; do
  for _ in $(seq 1 100); do curl -sf "http://$a/readyz" >/dev/null && break; sleep 0.1; done
done
redis-cli -p "$REDIS_PORT" info commandstats >"$OUT/commandstats-start.txt"

# The sampler: Redis's count and the gateways' figures, every SAMPLE_EVERY seconds, until
# stopped; each gateway's online sessions go to nodes.csv.
all_admins=("${admins[@]}")
SUMMED=(idlegate_redis_commands_total idlegate_redis_round_trips_total idlegate_ring_expired_total
  idlegate_frames_received_total idlegate_logins_total idlegate_online_users idlegate_redis_up
  process_resident_memory_bytes)
# Sums SUMMED over every gateway's metrics (each body after a "# node" line) on one line,
# then each gateway's online sessions on the next.
sum_bodies() {
  awk -v names="${SUMMED[*]}" -v nodes="$NODES" '
    BEGIN { k = split(names, M, " "); for (i = 1; i <= k; i++) W[M[i]] = i }
    $0 == "# node" { n++; next }
    /^#/ { next }
    { name = $1; sub(/\{.*/, "", name)
      if (name in W) S[W[name]] += $2
      if (name == "idlegate_online_sessions") N[n] += $2 }
    END { for (i = 1; i <= k; i++) printf ",%.0f", S[i]; printf "\n"
          for (j = 1; j <= nodes; j++) printf ",%s", (j in N ? N[j] : ""); printf "\n" }'
}
sample() {
  echo "unix_s,redis_commands,gw_redis_commands,gw_round_trips,expired,frames,logins,online,redis_up,gw_rss_bytes,redis_cpu_s,redis_memory_bytes,redis_events,loadtest_rss_kb,mem_used_kb,slab_kb,tcp_inuse"
  echo "unix_s$(for n in $(seq 1 "$NODES"); do printf ',gw%s' "$n"; done)" >"$OUT/nodes.csv"
  while :; do
    now=$(date +%s.%N)
    # A Redis that does not answer (paused) or a gateway that does not leaves its fields
    # empty; it must not end the sampler (which inherits set -e and pipefail).
    info=$(timeout 1 redis-cli -p "$REDIS_PORT" info 2>/dev/null | tr -d '\r') || info=
    redis=$(awk -F: '/^total_commands_processed:/ { print $2 }' <<<"$info")
    redis_cpu=$(awk -F: '/^used_cpu_(sys|user):/ { s += $2; n++ } END { if (n) printf "%.2f", s }' <<<"$info")
    redis_mem=$(awk -F: '/^used_memory:/ { print $2 }' <<<"$info")
    xlen=$(timeout 1 redis-cli -p "$REDIS_PORT" xlen '{idlegate}:events' 2>/dev/null) || xlen=
    sums=$(for a in "${all_admins[@]}"; do echo "# node"; curl -s --max-time 1 "http://$a/metrics" || true; done | sum_bodies)
    lt_rss=$( (ps -C loadtest -o rss= || true) | awk '{ s += $1 } END { printf "%.0f", s }')
    mem=$(awk '/^MemTotal:/ { t = $2 } /^MemAvailable:/ { a = $2 } /^Slab:/ { sl = $2 } END { printf "%d,%d", t - a, sl }' /proc/meminfo)
    tcp=$(awk '$1 == "TCP:" { print $3 }' /proc/net/sockstat)
    echo "$now,${redis:-}$(head -1 <<<"$sums"),${redis_cpu:-},${redis_mem:-},${xlen:-},$lt_rss,$mem,$tcp"
    echo "$now$(tail -1 <<<"$sums")" >>"$OUT/nodes.csv"
    sleep "$SAMPLE_EVERY"
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

snapshot() { # the machine now, into the file $1: memory per session is full load's less the baseline's
  {
    echo "== at $(date +%s.%N)"
    echo "== /proc/meminfo"; cat /proc/meminfo
    echo "== /proc/net/sockstat"; cat /proc/net/sockstat
    echo "== /proc/slabinfo"; cat /proc/slabinfo
    echo "== processes, count, rss_kb"
    ps -eo rss=,comm= | awk '{ s[$2] += $1; n[$2]++ } END { for (c in s) print c, n[c], s[c] }' | sort -k3 -n -r
    echo "== redis info memory"; redis-cli -p "$REDIS_PORT" info memory | tr -d '\r'
    echo "== gateways' online sessions"; tail -1 "$OUT/nodes.csv"
  } >"$1"
}
client_targets=("${targets[@]}")
kill_at=${KILL_AT:-$LOSE_AT}
if [ -n "$kill_at" ]; then
  # The last gateway dies kill_at seconds in. KILL_AT: every client is on it, the others
  # watch. LOSE_AT: the clients stay spread over every gateway and the others keep theirs;
  # the machine is snapshot before the first client and at full load, 5 s before the kill.
  victim=${gw_pids[-1]}
  [ -z "$LOSE_AT" ] || snapshot "$OUT/baseline.txt"
  (
    if [ -n "$LOSE_AT" ]; then
      sleep "$((LOSE_AT - 5))"
      snapshot "$OUT/full-load.txt"
      sleep 5
    else
      sleep "$KILL_AT"
    fi
    kill -KILL "$victim"
    echo "killed gw$NODES (pid $victim) $(date +%s.%N)" >>"$OUT/kill.txt"
  ) &
  pids+=($!)
  [ -z "$KILL_AT" ] || client_targets=("${targets[-1]}")
  admins=("${admins[@]:0:$((NODES - 1))}")
  apis=("${apis[@]:0:$((NODES - 1))}")
fi
# The backend's view: the first node's event stream, from before the first login. A
# connection that ends, or carries nothing for 40 s (an idle stream has a keep-alive every
# 15 s), is opened again from the last id received, as a backend's consumer would.
record_events() { # each connection into its own file, events.<n>.sse
  local last= n=0
  while :; do
    n=$((n + 1))
    curl -sN --speed-time 40 --speed-limit 1 ${last:+-H "Last-Event-ID: $last"} \
      "http://${apis[0]}/v1/events" >"$WORK/events.$n.sse" || true
    # The id of the last whole event (a cut one is left out, and asked for again).
    # (tac is cut off once awk has its line: under pipefail that must not void the answer.)
    last=$( (tac "$WORK/events.$n.sse" || true) | awk 'whole && /^id: / { print substr($0, 5); exit } /^$/ { whole = 1 }')
    echo "connection $n ended $(date +%s.%N); resuming after ${last:-nothing}" >>"$OUT/recorder.txt"
    sleep 1
  done
}
if [ "$RECORD_EVENTS" = 1 ]; then
  record_events &
  pids+=($!)
fi
flags=(--target "$(join "${client_targets[@]}")" --admin "$(join "${admins[@]}")" --connect-rate "$CONNECT_RATE"
  --duration "$DURATION" --ping-interval "$PING" --silent-fraction "$SILENT" --devices "$DEVICES"
  --scrape-interval "$SCRAPE" --check)
[ "$TOGETHER" = 1 ] && flags+=(--silent-together)
[ "$PUSH_RATE" != 0 ] && flags+=(--api "$(join "${apis[@]}")" --push-rate "$PUSH_RATE")
[ "$FOLLOW" = 1 ] && flags+=(--api "$(join "${apis[@]}")" --follow-events)
[ -n "$kill_at" ] && flags+=(--node-loss)
echo "start $(date +%s.%N) nodes $NODES processes $PROCESSES connections $CONNECTIONS flags ${flags[*]}" >"$OUT/run.txt"
verdict=0
loadtest/multi.sh "$PROCESSES" "$CONNECTIONS" "$OUT" "${flags[@]}" || verdict=$?
echo "end $(date +%s.%N) multi.sh exit status $verdict" >>"$OUT/run.txt"

# Once the clients have gone, nobody may look online: not in any gateway, not in Redis.
sleep 3
if [ "$RECORD_EVENTS" = 1 ]; then
  # The last offlines are in the stream once it has been still for a while.
  size=-1
  while [ "$(cat "$WORK"/events.*.sse | wc -c)" != "$size" ]; do
    size=$(cat "$WORK"/events.*.sse | wc -c)
    sleep 5
  done
fi
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
  # Counting through Lua walks the whole stream inside Redis; a recorded stream is counted
  # outside it.
  [ "$RECORD_EVENTS" = 1 ] || echo "redis_node_lost $(redis-cli -p "$REDIS_PORT" eval "local n = 0 for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do for i = 1, #e[2], 2 do if e[2][i] == 'r' and e[2][i + 1] == 'node_lost' then n = n + 1 end end end return n" 1 '{idlegate}:events')"
} >"$OUT/after.txt"
redis-cli -p "$REDIS_PORT" info commandstats >"$OUT/commandstats-end.txt"
# What the gateways warned of, counted by message (their logs go with the work folder).
cat "$WORK"/gw*.log | awk '/ (WARN|ERROR) /' | sed -E 's/^[^ ]+ +//; s/ [a-z_]+=.*//' | sort | uniq -c \
  | sort -rn >"$OUT/gateway-warnings.txt" || true
if [ "$RECORD_EVENTS" = 1 ]; then
  # Server-sent events to one JSON object a line (id, type and the data's fields), judged.
  python3 - "$OUT/events.jsonl" "$WORK" <<'PY'
import json, pathlib, sys
parts = sorted(pathlib.Path(sys.argv[2]).glob("events.*.sse"), key=lambda p: int(p.name.split(".")[1]))
with open(sys.argv[1], "w") as out:
    for part in parts:
        event = {}  # a block not ended by a blank line (a cut connection) is dropped
        for line in part.open():
            line = line.rstrip("\n")
            if not line:
                if "data" in event:
                    fields = json.loads(event["data"])
                    fields.update(id=event.get("id"), type=event.get("event", fields.get("type")))
                    out.write(json.dumps(fields, separators=(",", ":")) + "\n")
                event = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(":")
                event[key] = value[1:] if value.startswith(" ") else value
PY
  echo "redis_node_lost $(grep '"reason":"node_lost"' "$OUT/events.jsonl" | grep -c '"type":"offline"' || true)" >>"$OUT/after.txt"
  target/release/loadtest verdict --events "$OUT/events.jsonl" --out "$OUT/verdict.json" >"$OUT/verdict.txt" 2>&1 || verdict=1
fi
python3 loadtest/cluster-summary.py "$OUT" | tee "$OUT/summary.txt"
python3 loadtest/cluster-plot.py "$OUT" "$OUT/cluster.svg"
exit "$verdict"
