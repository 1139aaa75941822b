#!/usr/bin/env bash
# Side-by-side comparison of idlegate with its floor, its idiomatic peer and Mosquitto.
#
#   loadtest/compare.sh [connections] [seconds]      (defaults: 19000 30)
#
# Builds in release mode, then starts each server in turn on loopback and drives it with the
# same loadtest run:
#   idlegate               the gateway (ring)
#   per_connection_timer   same protocol, one tokio Sleep per connection (examples/)
#   echo_floor             same protocol, no idle detection at all (examples/)
#   mosquitto              Debian's MQTT broker, keepalive 60 s (MQTT load only for pings)
# Loads: "ping" (every client pings every second) on all four; "data" (every client sends
# 10 DATA frames a second) on the first three. CPU time and resident memory come from
# /proc/<pid>. Then the expiry check: idlegate (timeout 3 s, tick 100 ms) and Mosquitto
# (keepalive 2 s, so 3 s) with half of 2000 clients falling silent.
#
# Prints one table and writes target/compare.json. Everything runs on 127.0.0.1-127.0.0.4 and
# stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${1:-19000}
DURATION=${2:-30}
PORT=17070
ADMIN=17071
OUT=target/compare
LOADTEST=target/release/loadtest
# Connections come from four loopback addresses so 19,000 of them never crowd one
# address's ephemeral ports (which slows connect() down, and would be measured as login time).
SOURCES=127.0.0.1-127.0.0.4
CLK_TCK=$(getconf CLK_TCK)
mkdir -p "$OUT"

if ! command -v mosquitto >/dev/null 2>&1; then
  echo "== installing mosquitto"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto >/dev/null
fi
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)

echo "== building (release)"
cargo build --release -q -p idlegate -p loadtest --bins --examples

cpu_seconds() { awk -v t="$CLK_TCK" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
rss_bytes() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$1/status"; }

wait_for_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "server did not open port $PORT" >&2
  return 1
}

start_server() { # name -> sets PID
  case "$1" in
    idlegate)
      target/release/idlegate serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
        --timeout "${IDLE_TIMEOUT:-30s}" --tick "${IDLE_TICK:-1s}" 2>"$OUT/$1.log" &
      ;;
    per_connection_timer)
      target/release/examples/per_connection_timer --listen "127.0.0.1:$PORT" --timeout 30s 2>"$OUT/$1.log" &
      ;;
    echo_floor)
      target/release/examples/echo_floor --listen "127.0.0.1:$PORT" 2>"$OUT/$1.log" &
      ;;
    mosquitto)
      cat >"$OUT/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
max_connections -1
persistence false
max_keepalive 65535
log_dest stderr
log_type error
user root
EOF
      "$MOSQUITTO" -c "$OUT/mosquitto.conf" 2>"$OUT/$1.log" &
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

# run NAME LOAD [loadtest flags...]: one measured run; writes $OUT/NAME-LOAD.json.
run() {
  local name=$1 load=$2
  shift 2
  echo "== $name, $load load: $CONNECTIONS clients, ${DURATION}s"
  start_server "$name"
  local rss0 cpu0 rss_load
  rss0=$(rss_bytes "$PID")
  cpu0=$(cpu_seconds "$PID")
  # Resident memory at load: sampled once every client is connected and sending.
  local connect_s=$(((CONNECTIONS + 4999) / 5000 + 3))
  (sleep "$connect_s" && rss_bytes "$PID" >"$OUT/$name-$load.rss") &
  local sampler=$!
  "$LOADTEST" --target "127.0.0.1:$PORT" --connections "$CONNECTIONS" --connect-rate 5000 \
    --silent-fraction 0 --duration "${DURATION}s" --source-ips "$SOURCES" \
    --report "$OUT/$name-$load.lt.json" "$@" >"$OUT/$name-$load.txt" 2>"$OUT/$name-$load.progress" || true
  wait "$sampler" || true
  local cpu1
  cpu1=$(cpu_seconds "$PID")
  stop_server
  rss_load=$(cat "$OUT/$name-$load.rss")
  python3 - "$OUT/$name-$load.lt.json" "$OUT/$name-$load.json" "$name" "$load" "$rss0" "$rss_load" "$cpu0" "$cpu1" "$CONNECTIONS" <<'PY'
import json, sys
src, dst, name, load, rss0, rss1, cpu0, cpu1, conns = sys.argv[1:]
r = json.load(open(src))
frames = r["logins_ok"] + r["pings_sent"] + r["data_sent"]
cpu = float(cpu1) - float(cpu0)
out = {
    "server": name, "load": load, "connections": int(conns),
    "logins_ok": r["logins_ok"], "cpu_seconds": round(cpu, 2), "frames": frames,
    "cpu_us_per_frame": round(cpu * 1e6 / max(frames, 1), 3),
    "rss_bytes_at_start": int(rss0), "rss_bytes_at_load": int(rss1),
    "rss_bytes_per_connection": round((int(rss1) - int(rss0)) / int(conns), 1),
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
  "$LOADTEST" --target "127.0.0.1:$PORT" --connections 2000 --connect-rate 2000 --silent-fraction 0.5 \
    --ping-interval 500ms --duration 8s --report "$OUT/$name-expiry.json" "$@" \
    >"$OUT/$name-expiry.txt" 2>"$OUT/$name-expiry.progress" || true
  stop_server
}

run idlegate ping --ping-interval 1s --admin "127.0.0.1:$ADMIN"
run per_connection_timer ping --ping-interval 1s
run echo_floor ping --ping-interval 1s
run mosquitto ping --ping-interval 1s --protocol mqtt --mqtt-keepalive 60s
run idlegate data --ping-interval 10s --data-rate 10 --admin "127.0.0.1:$ADMIN"
run per_connection_timer data --ping-interval 10s --data-rate 10
run echo_floor data --ping-interval 10s --data-rate 10
IDLE_TIMEOUT=3s IDLE_TICK=100ms expiry idlegate
# Mosquitto gets 10 s past its 3 s before a client counts as missed, to see how late it is.
expiry mosquitto --protocol mqtt --mqtt-keepalive 2s --missed-grace 10s

# The worst tick: half the clients fall silent at the same moment (each with a last PING),
# so one sweep expires all of them while the other half keeps pinging every second.
echo "== idlegate, mass expiry: $((CONNECTIONS / 2)) of $CONNECTIONS silent at once"
IDLE_TIMEOUT=10s
start_server idlegate
"$LOADTEST" --target "127.0.0.1:$PORT" --connections "$CONNECTIONS" --connect-rate 5000 --silent-fraction 0.5 \
  --silent-together --ping-interval 1s --duration 20s --source-ips "$SOURCES" --admin "127.0.0.1:$ADMIN" \
  --report "$OUT/idlegate-mass.json" >"$OUT/idlegate-mass.txt" 2>"$OUT/idlegate-mass.progress" || true
stop_server
unset IDLE_TIMEOUT

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def read(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
result = {"runs": {}, "ratios": {}, "expiry": {}}
print()
print(f"{'load':<6} {'server':<22} {'logins':>7} {'cpu s':>7} {'frames':>9} {'cpu us/frame':>13} {'rss B/conn':>11} {'rtt p99 ms':>11}")
for load in ["ping", "data"]:
    runs = {}
    for server in ["idlegate", "per_connection_timer", "echo_floor", "mosquitto"]:
        r = read(f"{server}-{load}")
        if r is None:
            continue
        runs[server] = r
        print(f"{load:<6} {server:<22} {r['logins_ok']:>7} {r['cpu_seconds']:>7.2f} {r['frames']:>9} "
              f"{r['cpu_us_per_frame']:>13.3f} {r['rss_bytes_per_connection']:>11.0f} {r['rtt_ms_p99']:>11.3f}")
    result["runs"][load] = runs
    ig = runs.get("idlegate")
    if ig:
        for other, r in runs.items():
            if other == "idlegate":
                continue
            result["ratios"].setdefault(load, {})[other] = {
                "cpu_us_per_frame": round(ig["cpu_us_per_frame"] / r["cpu_us_per_frame"], 3) if r["cpu_us_per_frame"] else None,
                "rss_bytes_per_connection": round(ig["rss_bytes_per_connection"] / r["rss_bytes_per_connection"], 3) if r["rss_bytes_per_connection"] else None,
                "rtt_ms_p99": round(ig["rtt_ms_p99"] / r["rtt_ms_p99"], 3) if r["rtt_ms_p99"] else None,
            }
print()
print("ratios idlegate / other:")
for load, others in result["ratios"].items():
    for other, q in others.items():
        print(f"  {load:<5} vs {other:<22} cpu/frame {q['cpu_us_per_frame']}  rss/conn {q['rss_bytes_per_connection']}  rtt p99 {q['rtt_ms_p99']}")
print()
print(f"{'expiry':<10} {'timeout ms':>10} {'silent':>7} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'early':>6} {'late':>6} {'missed':>7} {'false':>6}")
for server in ["idlegate", "mosquitto"]:
    r = read(f"{server}-expiry")
    if r is None:
        continue
    s = r["silence_ms"]
    row = {"timeout_ms": r["timeout_ms"], "tick_ms": r["tick_ms"], "silent": r["silent_clients"], "p50": s["p50"], "p99": s["p99"],
           "max": s["max"], "min": s["min"], "early": r["early_offline"], "late": r["late_offline"], "missed": r["missed_offline"],
           "false": r["false_offline"], "overshoot_max_ms": round(s["max"] - (r["timeout_ms"] or 0), 1)}
    result["expiry"][server] = row
    print(f"{server:<10} {row['timeout_ms']:>10.0f} {row['silent']:>7} {row['p50']:>9.1f} {row['p99']:>9.1f} {row['max']:>9.1f} "
          f"{row['early']:>6} {row['late']:>6} {row['missed']:>7} {row['false']:>6}")
r = read("idlegate-mass")
if r is not None:
    sweep_at = 10.0 + (r["timeout_ms"] or 0) / 1000
    # The worst per-second round-trip p99 from the moment the clients fell silent on: it
    # includes the second of the sweep that expired them together.
    after = [s for s in r["timeline"] if s["t"] >= 10.0]
    worst = max(after, key=lambda s: s["rtt_p99_ms"]) if after else None
    result["mass_expiry"] = {
        "silent_together": r["silent_clients"], "expired_in_window": r["expired_in_window"],
        "early": r["early_offline"], "late": r["late_offline"], "missed": r["missed_offline"],
        "false_offline": r["false_offline"], "rtt_ms_p99_whole_run": r["rtt_ms"]["p99"],
        "rtt_ms_p99_worst_second": worst["rtt_p99_ms"] if worst else None,
        "worst_second_at_s": worst["t"] if worst else None, "sweep_expected_at_s": sweep_at,
    }
    m = result["mass_expiry"]
    print(f"\nmass expiry: {m['silent_together']} silent at once, {m['expired_in_window']} expired in the window "
          f"(early {m['early']}, late {m['late']}, missed {m['missed']}, false {m['false_offline']}); active clients' "
          f"round-trip p99 {m['rtt_ms_p99_whole_run']:.2f} ms over the run, {m['rtt_ms_p99_worst_second']:.2f} ms in the worst second "
          f"(t = {m['worst_second_at_s']:.0f} s; the sweep was due at {sweep_at:.0f} s)")
json.dump(result, open("target/compare.json", "w"), indent=2)
print("\nwrote target/compare.json")
PY
