#!/usr/bin/env bash
# The TLS door's first records against tlsfuzzer (https://github.com/tlsfuzzer/tlsfuzzer),
# a TLS conformance suite nobody here wrote (issue 48, defect 12). Each gateway binary
# given serves its TLS door (--tls-listen) and, beside it, rustls's own server on the
# HTTPS API (--api-tls) with the same certificate; the scripts that probe huge and
# SSLv2-format ClientHellos, TLS 1.3 record sizes and Finished messages run against both,
# and each probe's verdict is kept.
#
#   loadtest/tlsfuzzer-records.sh TLSFUZZER_DIR OUT_DIR LABEL=GATEWAY_BINARY [...]
#
# TLSFUZZER_DIR holds a tlsfuzzer checkout (it is not on PyPI); its Python needs
# tlslite-ng and ecdsa (`pip install tlslite-ng==0.9.0b2 ecdsa`), taken from $PYTHON
# (default python3). Loopback only. OUT_DIR/summary.txt has one line per run: probes run,
# passed, failed as the script expects (XFAIL), failed; OUT_DIR/<label>-<listener>-
# <script>.failed names the failed probes, .why counts how they failed.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,15p' "$0"
    exit 2
fi
fuzzer=$(cd "$1" && pwd)
out=$2
shift 2
mkdir -p "$out"
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# The scripts (tlsfuzzer/_apps/<name>.py) and their arguments. -d: (EC)DHE, as rustls
# has no RSA key exchange; -n 0: every probe. Left out as not applicable here: scripts that
# need RSA key exchange (test_fuzzed_finished) or an application-data answer
# (test_record_size_limit's --reply-AD-size: the door speaks idlegate's protocol).
scripts=(
    "test_large_hello -d -n 0"
    "test_tls13_record_layer_limits"
    "test_tls13_finished"
    "test_sslv2hello_protocol -d"
    "test_sslv2_connection"
)

openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/key.pem" -out "$work/cert.pem" \
    -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null

free_port() {
    "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

summary="$out/summary.txt"
echo "# loadtest/tlsfuzzer-records.sh; tlsfuzzer ${TLSFUZZER_COMMIT:-$(git -C "$fuzzer" rev-parse --short HEAD 2>/dev/null || echo checkout)}" >"$summary"
echo "# label listener script total pass xfail fail (names: <label>-<listener>-<script>.failed, how: .why)" >>"$summary"

for pair in "$@"; do
    label=${pair%%=*}
    binary=${pair#*=}
    tls=$(free_port)
    api=$(free_port)
    "$binary" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --api-listen "127.0.0.1:$api" --api-tls \
        --tls-listen "127.0.0.1:$tls" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" \
        >"$work/$label-gateway.log" 2>&1 &
    gateway=$!
    for _ in $(seq 100); do
        (echo >"/dev/tcp/127.0.0.1/$tls") 2>/dev/null && (echo >"/dev/tcp/127.0.0.1/$api") 2>/dev/null && break
        sleep 0.1
    done
    for listener in door:$tls rustls:$api; do
        name=${listener%%:*}
        port=${listener#*:}
        for entry in "${scripts[@]}"; do
            read -r script args <<<"$entry"
            log="$work/$label-$name-$script.log"
            # shellcheck disable=SC2086 # args are words
            (cd "$fuzzer" && PYTHONPATH=. timeout 900 "$python" "tlsfuzzer/_apps/$script.py" -h 127.0.0.1 -p "$port" $args) \
                >"$log" 2>&1 || true
            count() { grep -oP "^$1: \K[0-9]+" "$log" | tail -1 || echo '?'; }
            # tlsfuzzer lists the failed probes after "FAILED:", one a line, quoted; a log
            # of every probe runs to hundreds of megabytes, so what is kept is the names
            # and how each failed, counted.
            base="$out/$label-$name-$script"
            sed -n '/^FAILED:/,/^[^\t]/p' "$log" | grep -P '^\t' | tr -d "\t'" >"$base.failed" || true
            grep -h 'AssertionError:' "$log" | sort | uniq -c | sort -rn >"$base.why" || true
            echo "$label $name $script $(count TOTAL) $(count PASS) $(count XFAIL) $(count FAIL)" | tee -a "$summary"
        done
    done
    kill "$gateway"
    wait "$gateway" 2>/dev/null || true
done
