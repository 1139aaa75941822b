#!/usr/bin/env bash
# A nemesis campaign: `loadtest nemesis` once per seed, then one table of the faults
# injected and the violations found (docs/RELIABILITY.md publishes it).
#
#   loadtest/nemesis-campaign.sh OUT DURATION SEED...
#   loadtest/nemesis-campaign.sh docs/results/nemesis 4m $(seq 1 20)
#
# Each seed's files go to OUT/seed-N (schedule.json, events.jsonl, presence.jsonl,
# clients.jsonl, verdict.json, the gateways' logs); OUT/summary.md is the table, rebuilt from
# every OUT/seed-*/verdict.json. NEMESIS_ARGS adds flags (for example --redis-cluster). Each
# seed's `commit` names the commit its binaries were built from.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1 duration=$2
shift 2
cargo build -q --release --bin idlegate
cargo build -q --release -p loadtest --bin loadtest
# The binaries the whole campaign runs, apart from target/ (a build meanwhile changes
# nothing), and the commit they were built from, kept with each seed's files.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
cp target/release/idlegate target/release/loadtest "$bin/"
commit=$(git describe --always --dirty)
mkdir -p "$out"
for seed in "$@"; do
  dir="$out/seed-$seed"
  rm -rf "$dir"
  status=0
  # shellcheck disable=SC2086
  "$bin/loadtest" nemesis --gateway "$bin/idlegate" --seed "$seed" --duration "$duration" \
    --out "$dir" ${NEMESIS_ARGS:-} >"$dir.log" 2>&1 || status=$?
  mv "$dir.log" "$dir/run.log"
  echo "$commit" >"$dir/commit"
  echo "seed $seed: exit $status"
done
python3 - "$out" <<'PY'
import json, pathlib, sys, collections
out = pathlib.Path(sys.argv[1])
kinds = ["kill", "stop", "partition", "redis_restart", "redis_failover", "stall", "clock",
         "delay", "slow_redis", "slow_receiver", "slow_consumer"]
rows, total, bad = [], collections.Counter(), 0
for d in sorted(out.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
    v = json.loads((d / "verdict.json").read_text())
    s = json.loads((d / "schedule.json").read_text())["settings"]
    grace = s.get("offline_grace_ms", 0) / 1000
    total.update(v["faults"])
    found = collections.Counter(x["kind"] for x in v["violations"])
    bad += sum(found.values())
    rows.append(f"| {d.name[5:]} | {s['duration_ms'] // 1000} s | {s['nodes']} | {'cluster' if s['redis_cluster'] else 'one'} | {s.get('max_devices', 3)} | {grace:g} s | "
                + " | ".join(str(v["faults"].get(k, 0)) for k in kinds)
                + f" | {v['sessions']} | {v.get('superseded', 0)} | {v['kept_sessions_checked']} | {v.get('killed_before_batch', 0)} | {v['gaps']} | "
                + (", ".join(f"{k} x{n}" for k, n in found.items()) or "none") + " |")
head = "| seed | run | nodes | Redis | max devices | grace | " + " | ".join(kinds) + " | sessions | superseded | kept sessions checked | killed before their batch | gaps | violations |"
lines = [head, "|" + "---|" * (head.count("|") - 1)] + rows
lines.append(f"| all | | | | | | " + " | ".join(str(total.get(k, 0)) for k in kinds) + f" | | | | | | {bad} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
