# Sourced by loadtest/ping-instructions.sh and loadtest/ping-syscalls.sh: one fixed workload
# (loadtest/pings.py) against one server started under a counting tool, so both count the
# very same packets. The caller sets CONNECTIONS and PINGS first.
#
# Doors: tcp, ws, tls, wss and mqtt are idlegate's (one gateway with every door open);
# mosquitto is Debian's broker under the same MQTT workload as mqtt. IDLEGATE_BIN names
# another gateway binary (one built from an older commit, for a before/after).
if [ -z "${IDLEGATE_BIN:-}" ]; then
  cargo build --release -q -p idlegate
  IDLEGATE_BIN=target/release/idlegate
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. loadtest/certs.sh
test_certs "$work"
BASE=17170
declare -A PORT=([tcp]=$BASE [tls]=$((BASE + 1)) [ws]=$((BASE + 2)) [wss]=$((BASE + 3)) [mqtt]=$((BASE + 4))
  [mosquitto]=$((BASE + 5)))
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
printf '%s\n' "listener ${PORT[mosquitto]} 127.0.0.1" "allow_anonymous true" "persistence false" \
  "log_dest none" "user root" >"$work/mosquitto.conf"

# workload DOOR PINGS TOOL [ARGS...]: the server for DOOR under TOOL, the workload with PINGS
# rounds of pings against it, then the server stopped. Ticks are 10 s so the ticker adds
# (almost) nothing.
workload() {
  local door=$1 pings=$2 pattern
  shift 2
  if [ "$door" = mosquitto ]; then
    pattern="$MOSQUITTO -c $work/mosquitto.conf"
    "$@" "$MOSQUITTO" -c "$work/mosquitto.conf" >/dev/null 2>&1 &
  else
    pattern="idlegate serve --listen 127.0.0.1:${PORT[tcp]}"
    "$@" "$IDLEGATE_BIN" serve \
      --listen "127.0.0.1:${PORT[tcp]}" --tls-listen "127.0.0.1:${PORT[tls]}" --ws-listen "127.0.0.1:${PORT[ws]}" \
      --wss-listen "127.0.0.1:${PORT[wss]}" --mqtt-listen "127.0.0.1:${PORT[mqtt]}" --tls-cert "$work/gateway.pem" \
      --tls-key "$work/gateway.key" --admin-listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --timeout 600s --tick 10s --max-data-rate 0 \
      >/dev/null 2>&1 &
  fi
  local pid=$!
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/${PORT[$door]}") 2>/dev/null && break
    sleep 0.1
  done
  local speaks=$door
  [ "$door" = mosquitto ] && speaks=mqtt
  python3 loadtest/pings.py "$speaks" "${PORT[$door]}" "$CONNECTIONS" "$pings" "$work/ca.pem"
  # The server itself, which under strace is the tool's child: the tool reports once its
  # tracee has exited.
  pkill -TERM -f "$pattern"
  wait "$pid" || true
}
