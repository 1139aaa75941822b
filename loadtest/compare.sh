#!/usr/bin/env bash
# Side-by-side comparison of idlegate with its floor, its idiomatic peer and Mosquitto.
#
#   loadtest/compare.sh [connections] [seconds] [runs] [out dir]
#                                    (defaults: 19000 30 3 target/compare; about 25 minutes)
#
# Builds in release mode, then starts each server in turn on loopback and drives it with the
# same loadtest run. The server runs pinned to one core (SERVER_CPU, default 0) and the load
# generator to the other (LOAD_CPU, default 1), so they no longer take CPU from each other;
# each server then has one core, and the tokio servers one worker thread (tokio counts the
# cores a process may run on). Every load runs RUNS times, interleaved (idlegate, timer,
# floor, mosquitto, idlegate, ...), so a drift of the machine touches every server alike;
# loadtest/compare-summary.py prints medians and spreads from the raw files:
#   idlegate               the gateway (ring)
#   per_connection_timer   same protocol, one tokio Sleep per connection (loadtest/baselines/)
#   echo_floor             same protocol, no idle detection at all (loadtest/baselines/)
#   mosquitto              Debian's MQTT broker, keepalive 60 s (MQTT load only for pings)
# Loads: "ping" (every client pings every second) on all four; "data" (every client sends
# 10 DATA frames a second) on the first three. CPU time and resident memory come from
# /proc/<pid>. Then the expiry check: idlegate (timeout 3 s, tick 100 ms) and Mosquitto
# (keepalive 2 s, so 3 s) with half of 2000 clients falling silent.
#
# Memory is read once every client is connected (the server holds a descriptor per client),
# not after a fixed time: a slow acceptor (Mosquitto) would otherwise be read half empty;
# and again a second before the load ends, every client still connected. The figure per
# connection is the larger of the two over the clients: what a server holds once its
# clients have been active a while, not only once they are in.
# Writes <out dir>/<server>-<load>-<run>.json (and the loadtest's own report and output
# beside it), then runs compare-summary.py over them, which prints the tables and writes
# <out dir>/summary.json. Everything runs on 127.0.0.1-127.0.0.4 and stops by itself.
#
# The doors (TLS and WebSocket): SERVERS picks the servers, LOADS the loads, EXPIRY=0 skips
# the expiry check. Beyond the four above:
#   idlegate_tls, idlegate_ws, idlegate_wss   the gateway's other doors, same load
#   idlegate_mqtt                             the gateway's MQTT door (--mqtt-listen) under
#                                             the very MQTT load Mosquitto gets
#   mosquitto_tls                             Mosquitto's own TLS listener (MQTT load)
#   node_ws                                   Node's `ws` package holding the same
#                                             WebSocket clients (loadtest/node-ws-server.js:
#                                             answers LOGIN and PING, expires no one)
# The MQTT load's clients announce a keepalive of MQTT_KEEPALIVE (default 20 s, which the
# MQTT door accepts under its 30 s timeout) and ping every second, to both servers alike. With
# idlegate_mqtt among the servers the expiry check runs over MQTT: idlegate's MQTT door
# (timeout 6 s, tick 100 ms; its clients announce 2 s, the longest it takes for 6 s) against
# Mosquitto (keepalive 4 s: also 6 s). The MQTT side by side:
#   SERVERS="idlegate_mqtt mosquitto" LOADS=ping loadtest/compare.sh 19000 30 3 docs/results/mqtt-19000
# Certificates come from a test CA made with openssl in <out dir>/tls. For example:
#   SERVERS="idlegate idlegate_ws idlegate_tls idlegate_wss mosquitto mosquitto_tls node_ws" \
#     LOADS=ping EXPIRY=0 loadtest/compare.sh 19000 50 3 docs/results/doors-19000
# TLS clients come in at TLS_CONNECT_RATE (default 800) a second, the others at 5000; the
# run must be long enough for the ramp (24 s at 800) and a steady span after it.
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${1:-19000}
DURATION=${2:-30}
RUNS=${3:-3}
OUT=${4:-target/compare}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT=17070
ADMIN=17071
LOADTEST=target/release/loadtest
# Connections come from four loopback addresses so 19,000 of them never crowd one
# address's ephemeral ports (which slows connect() down, and would be measured as login time).
SOURCES=127.0.0.1-127.0.0.4
CLK_TCK=$(getconf CLK_TCK)
SERVERS=${SERVERS:-idlegate per_connection_timer echo_floor mosquitto}
LOADS=${LOADS:-ping data}
EXPIRY=${EXPIRY:-1}
MQTT_KEEPALIVE=${MQTT_KEEPALIVE:-20s}
rm -rf "$OUT"
mkdir -p "$OUT"
command -v taskset >/dev/null || { echo "compare.sh: needs taskset (apt-get install util-linux)" >&2; exit 2; }

if ! command -v mosquitto >/dev/null 2>&1; then
  echo "== installing mosquitto"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto >/dev/null
fi
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)

# Doors with TLS: a CA and a certificate for 127.0.0.1 signed by it.
CA="$OUT/tls/ca.pem"
CERT="$OUT/tls/gateway.pem"
KEY="$OUT/tls/gateway.key"
if [[ "$SERVERS" == *tls* || "$SERVERS" == *wss* ]]; then
  . loadtest/certs.sh
  test_certs "$OUT/tls"
fi
if [[ "$SERVERS" == *node_ws* && ! -d "$OUT/node/node_modules/ws" ]]; then
  echo "== installing Node's ws package"
  mkdir -p "$OUT/node"
  (cd "$OUT/node" && npm install --silent --no-audit --no-fund ws@8 >/dev/null)
fi

echo "== building (release)"
cargo build --release -q -p idlegate -p loadtest --bins

cpu_seconds() { awk -v t="$CLK_TCK" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
rss_bytes() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$1/status"; }
open_fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }

wait_for_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "server did not open port $PORT" >&2
  return 1
}

# idlegate [door flags...]: the gateway with the door under test on $PORT, exec'd so that
# the $! of its background call is its pid (stop_server kills it). The bounds on logins in
# progress are lifted to the run's size: a ramp of TLS handshakes faster than one core
# completes them would otherwise be shed (as it should be in production), and this run
# measures the connections, not the shedding.
idlegate() {
  exec taskset -c "$SERVER_CPU" target/release/idlegate serve --admin-listen "127.0.0.1:$ADMIN" \
    --api-listen "127.0.0.1:$((ADMIN + 1))" --timeout "${IDLE_TIMEOUT:-30s}" --tick "${IDLE_TICK:-1s}" \
    --max-pending-logins "$CONNECTIONS" --max-pending-logins-per-ip "$CONNECTIONS" "$@"
}

# mosquitto_conf NAME [listener lines...]: $OUT/NAME.conf, Mosquitto on $PORT with no limit
# on connections or keepalive, logging errors only.
mosquitto_conf() {
  local name=$1
  shift
  {
    echo "listener $PORT 127.0.0.1"
    printf '%s\n' "$@"
    printf '%s\n' "allow_anonymous true" "max_connections -1" "persistence false" "max_keepalive 65535" \
      "log_dest stderr" "log_type error" "user root"
  } >"$OUT/$name.conf"
}

start_server() { # name -> sets PID
  case "$1" in
    idlegate)
      idlegate --listen "127.0.0.1:$PORT" 2>"$OUT/$1.log" &
      ;;
    idlegate_tls)
      idlegate --listen "127.0.0.1:$((PORT + 10))" --tls-listen "127.0.0.1:$PORT" --tls-cert "$CERT" --tls-key "$KEY" \
        2>"$OUT/$1.log" &
      ;;
    idlegate_ws)
      idlegate --listen "127.0.0.1:$((PORT + 10))" --ws-listen "127.0.0.1:$PORT" 2>"$OUT/$1.log" &
      ;;
    idlegate_wss)
      idlegate --listen "127.0.0.1:$((PORT + 10))" --wss-listen "127.0.0.1:$PORT" --tls-cert "$CERT" --tls-key "$KEY" \
        2>"$OUT/$1.log" &
      ;;
    idlegate_mqtt)
      idlegate --listen "127.0.0.1:$((PORT + 10))" --mqtt-listen "127.0.0.1:$PORT" 2>"$OUT/$1.log" &
      ;;
    node_ws)
      NODE_PATH="$OUT/node/node_modules" taskset -c "$SERVER_CPU" node loadtest/node-ws-server.js "$PORT" \
        2>"$OUT/$1.log" &
      ;;
    mosquitto_tls)
      mosquitto_conf "$1" "certfile $CERT" "keyfile $KEY"
      taskset -c "$SERVER_CPU" "$MOSQUITTO" -c "$OUT/$1.conf" 2>"$OUT/$1.log" &
      ;;
    per_connection_timer)
      taskset -c "$SERVER_CPU" target/release/per_connection_timer --listen "127.0.0.1:$PORT" --timeout 30s 2>"$OUT/$1.log" &
      ;;
    echo_floor)
      taskset -c "$SERVER_CPU" target/release/echo_floor --listen "127.0.0.1:$PORT" 2>"$OUT/$1.log" &
      ;;
    mosquitto)
      mosquitto_conf "$1"
      taskset -c "$SERVER_CPU" "$MOSQUITTO" -c "$OUT/$1.conf" 2>"$OUT/$1.log" &
      ;;
  esac
  PID=$!
  wait_for_port
  sleep 1
}

stop_server() {
  kill -TERM "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
}

# run N NAME LOAD [loadtest flags...]: measured run N; writes $OUT/NAME-LOAD-N.json.
run() {
  local n=$1 name=$2 load=$3
  shift 3
  local base="$OUT/$name-$load-$n"
  echo "== run $n: $name, $load load: $CONNECTIONS clients, ${DURATION}s"
  start_server "$name"
  local rss0 cpu0 rss_load fds0
  rss0=$(rss_bytes "$PID")
  cpu0=$(cpu_seconds "$PID")
  fds0=$(open_fds "$PID")
  # Resident memory at load: read once the server holds a descriptor for every client (and
  # a second later, so they have all logged in), or at the run's end if they never all do.
  (
    for _ in $(seq 1 $((DURATION * 10))); do
      [ "$(open_fds "$PID")" -ge $((fds0 + CONNECTIONS)) ] && break
      sleep 0.1
    done
    sleep 1
    echo "$(rss_bytes "$PID") $(cpu_seconds "$PID") $(date +%s.%N)" >"$base.rss"
  ) &
  local sampler=$!
  # And at the end of the load, every client still connected: what a gateway holds once
  # its clients have been active a while (the ring's buckets, the event log), not only once
  # they are in.
  (
    sleep $((DURATION - 1))
    echo "$(rss_bytes "$PID") $(cpu_seconds "$PID") $(date +%s.%N)" >"$base.rss-end"
  ) &
  local end_sampler=$!
  taskset -c "$LOAD_CPU" "$LOADTEST" --target "127.0.0.1:$PORT" --connections "$CONNECTIONS" \
    --connect-rate "$(connect_rate "$name")" --silent-fraction 0 --duration "${DURATION}s" --source-ips "$SOURCES" \
    --report "$base.lt.json" "$@" >"$base.txt" 2>"$base.progress" || true
  wait "$sampler" || true
  wait "$end_sampler" || true
  local cpu1
  cpu1=$(cpu_seconds "$PID")
  stop_server
  # "rss cpu time" at load and at the end: between them every client is in and pings once
  # a second, so the CPU over that span per connection-second is the CPU per PING in steady
  # state, with the handshakes and logins of the ramp left out.
  rss_load=$(cat "$base.rss")
  rss_end=$(cat "$base.rss-end")
  rm -f "$base.rss" "$base.rss-end" # kept in $base.json
  python3 - "$base.lt.json" "$base.json" "$name" "$load" "$rss0" "$rss_load" "$rss_end" "$cpu0" "$cpu1" "$CONNECTIONS" "$n" <<'PY'
import json, sys
src, dst, name, load, rss0, at_load, at_end, cpu0, cpu1, conns, n = sys.argv[1:]
r = json.load(open(src))
rss1, cpu_load, t_load = at_load.split()
rss2, cpu_end, t_end = at_end.split()
span = float(t_end) - float(t_load)
steady = (float(cpu_end) - float(cpu_load)) * 1e6 / (span * int(conns)) if span > 0 else None
frames = r["logins_ok"] + r["pings_sent"] + r["data_sent"]
cpu = float(cpu1) - float(cpu0)
out = {
    "server": name, "load": load, "run": int(n), "connections": int(conns),
    "logins_ok": r["logins_ok"], "cpu_seconds": round(cpu, 2), "frames": frames,
    "cpu_us_per_frame": round(cpu * 1e6 / max(frames, 1), 3),
    "rss_bytes_at_start": int(rss0), "rss_bytes_at_load": int(rss1), "rss_bytes_at_end": int(rss2),
    "rss_bytes_per_connection_at_load": round((int(rss1) - int(rss0)) / int(conns), 1),
    "rss_bytes_per_connection": round((max(int(rss1), int(rss2)) - int(rss0)) / int(conns), 1),
    "steady_seconds": round(span, 1),
    "cpu_us_per_connection_second_steady": round(steady, 3) if steady is not None else None,
    "rtt_ms_p99": r["rtt_ms"]["p99"], "rtt_ms_p50": r["rtt_ms"]["p50"],
    "unexpected_closes": r["unexpected_closes"], "false_offline": r["false_offline"],
}
json.dump(out, open(dst, "w"), indent=2)
PY
}

# expiry NAME [loadtest flags...]: half of 2000 clients fall silent; writes $OUT/NAME-expiry.json.
expiry() {
  local name=$1
  shift
  echo "== $name, expiry check"
  start_server "$name"
  taskset -c "$LOAD_CPU" "$LOADTEST" --target "127.0.0.1:$PORT" --connections 2000 --connect-rate 2000 --silent-fraction 0.5 \
    --ping-interval 500ms --duration 8s --report "$OUT/$name-expiry.json" "$@" \
    >"$OUT/$name-expiry.txt" 2>"$OUT/$name-expiry.progress" || true
  stop_server
}

# Connections per second while the clients come in. A TLS handshake costs both sides far
# more than a TCP connect: at 5000 a second the one core of each side falls behind, logins
# queue past the login deadline, and the run measures an overload instead of connections.
connect_rate() {
  case "$1" in
    *tls | *wss) echo "${TLS_CONNECT_RATE:-800}" ;;
    *) echo 5000 ;;
  esac
}

# The loadtest flags each server needs beyond the load's.
flags() {
  case "$1" in
    idlegate) echo --admin "127.0.0.1:$ADMIN" ;;
    idlegate_tls) echo --admin "127.0.0.1:$ADMIN" --transport tls --tls-ca "$CA" ;;
    idlegate_ws) echo --admin "127.0.0.1:$ADMIN" --transport ws ;;
    idlegate_wss) echo --admin "127.0.0.1:$ADMIN" --transport wss --tls-ca "$CA" ;;
    node_ws) echo --transport ws ;;
    idlegate_mqtt) echo --admin "127.0.0.1:$ADMIN" --protocol mqtt --mqtt-keepalive "$MQTT_KEEPALIVE" \
      --mqtt-timeout "${IDLE_TIMEOUT:-30s}" --mqtt-tick "${IDLE_TICK:-1s}" ;;
    mosquitto) echo --protocol mqtt --mqtt-keepalive "$MQTT_KEEPALIVE" ;;
    mosquitto_tls) echo --protocol mqtt --mqtt-keepalive "$MQTT_KEEPALIVE" --transport tls --tls-ca "$CA" ;;
  esac
}

for load in $LOADS; do
  for n in $(seq 1 "$RUNS"); do
    for server in $SERVERS; do
      # shellcheck disable=SC2046 # the flags are words
      case "$load" in
        ping) run "$n" "$server" ping --ping-interval 1s $(flags "$server") ;;
        # Mosquitto and Node take part in the ping load only.
        data) [[ "$server" == mosquitto* || "$server" == node* ]] ||
          run "$n" "$server" data --ping-interval 10s --data-rate 10 $(flags "$server") ;;
      esac
    done
  done
done
if [ "$EXPIRY" = 1 ] && [[ " $SERVERS " == *" idlegate_mqtt "* ]]; then
  IDLE_TIMEOUT=6s IDLE_TICK=100ms expiry idlegate_mqtt --protocol mqtt --mqtt-keepalive 2s --mqtt-timeout 6s \
    --mqtt-tick 100ms
  # Mosquitto gets 10 s past its 6 s before a client counts as missed, to see how late it is.
  expiry mosquitto --protocol mqtt --mqtt-keepalive 4s --missed-grace 10s
elif [ "$EXPIRY" = 1 ]; then
  IDLE_TIMEOUT=3s IDLE_TICK=100ms expiry idlegate
  # Mosquitto gets 10 s past its 3 s before a client counts as missed, to see how late it is.
  expiry mosquitto --protocol mqtt --mqtt-keepalive 2s --missed-grace 10s
fi

# The worst tick (half the clients silent at once) has a script of its own,
# loadtest/mass-expiry.sh, which keeps the silent clients' closes out of the active
# clients' load generator.

python3 loadtest/compare-summary.py "$OUT" | tee "$OUT/summary.txt"
