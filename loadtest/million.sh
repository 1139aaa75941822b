#!/usr/bin/env bash
# One million sessions on one machine, the guarantee checked while they are held.
#
#   loadtest/million.sh <out dir>
#
# loadtest/cluster.sh with these defaults (each can be set from the environment):
# - 53 gateways on one Redis, about 18,900 sessions each: a process may open at most 20,000
#   files here, so one gateway holds about 19,000 connections;
# - 64 loadtest processes of 15,625 clients, each connecting from its own four loopback
#   addresses (loadtest/multi.sh), so no address runs out of ephemeral ports; 50 logins a
#   second each, 3,200 a second in all;
# - every active client pings every 22 s (jittered by 10 %, so at most 24.2 s): the 30 s
#   timeout less its 1 s tick leaves 4.8 s for a client or gateway a busy two-core machine runs late;
# - 2 % of the clients fall silent together half way through (540 s) and must each go offline
#   inside the guarantee's window, in one sweep per gateway;
# - the last gateway is killed -9 at full load (420 s): exactly its sessions must end as
#   node_lost, and no other session may end before the clients do (the event stream is
#   recorded from the first gateway and judged whole);
# - the run lasts 18 minutes, so the sessions are held for more than 10 after the last login;
#   the gateways and Redis are sampled every 5 s, the loadtest processes read the gateways
#   every 30 s (64 processes reading 53 gateways every second would cost more than pings).
# The figures (summary.txt) and the picture (cluster.svg) come out with the raw files.
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/usage.sh
[ $# -eq 1 ] || usage
export NODES=${NODES:-53} PROCESSES=${PROCESSES:-64} CONNECTIONS=${CONNECTIONS:-1000000}
export CONNECT_RATE=${CONNECT_RATE:-50} DURATION=${DURATION:-1080s} PING=${PING:-22s}
export SILENT=${SILENT:-0.02} TOGETHER=${TOGETHER:-1} LOSE_AT=${LOSE_AT:-420}
export RECORD_EVENTS=${RECORD_EVENTS:-1} SAMPLE_EVERY=${SAMPLE_EVERY:-5} SCRAPE=${SCRAPE:-30s}
exec loadtest/cluster.sh "$1"
