#!/usr/bin/env bash
# An idle TLS session's state, the door's record layer beside rustls's own connection, in
# one sitting (A B A B): examples/tls_session_memory.rs keeps SESSIONS sessions of one kind
# after an in-memory handshake and reports resident memory per session.
#
#   loadtest/tls-session-memory.sh [rounds] [sessions] [out]
#                                  (defaults: 3 10000 target/tls-session-memory.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} sessions=${2:-10000}
OUT=${3:-target/tls-session-memory.txt}
cargo build --release -q --example tls_session_memory
mkdir -p "$(dirname "$OUT")"
{
  echo "# loadtest/tls-session-memory.sh $rounds $sessions"
  echo "# state version sessions rss_bytes_per_session"
  for _ in $(seq "$rounds"); do
    for version in 1.3 1.2; do
      for state in door rustls; do
        target/release/examples/tls_session_memory "$state" "$version" "$sessions"
      done
    done
  done
} | tee "$OUT"
