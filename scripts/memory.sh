#!/usr/bin/env bash
# Memory under hostile tool data (not part of CI): an optimised `release-harness serve` on a
# private Redis, two runs of CALLS calls whose records hold ~200 KB each (a 100 KB scope
# query inside agent_result and a 100 KB raw_response), then a controlled stop of each run
# (which reads up to progress.max_calls records) and a judged release citing 20 calls with
# a 1 MB scope query each. Prints the harness's RSS before, its peak (VmHWM) during, and RSS
# after each release, plus the answers' sizes.
#   scripts/memory.sh [CALLS=1000]        BIN=path/to/release-harness to measure another build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
calls=${1:-1000}
work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
release_bin
prefix="mem-$$"
port=$(free_port)

# seed RUN COUNT QUERY_BYTES RAW_BYTES: writes the records as RESP for redis-cli --pipe.
seed() {
  python3 - "$prefix" "$@" <<'PY' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
import json, sys
prefix, run, count, query_bytes, raw_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
out = sys.stdout.buffer
def cmd(*args):
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    out.write(b"*%d\r\n" % len(parts))
    for p in parts:
        out.write(b"$%d\r\n%s\r\n" % (len(p), p))
query = "level:ERROR AND timeout " + "x" * query_bytes
raw = "R" * raw_bytes
for i in range(count):
    call = f"call-{i:05d}"
    projection = {"tool": "log_search", "tool_call_id": call, "evidence_status": "EVIDENCE_FOUND",
                  "scope": {"service": "order-api", "query": query, "from": "2026-12-01T10:00:00Z",
                            "to": "2026-12-01T11:00:00Z", "limit": 50},
                  "total_matches": 3,
                  "entries": [{"timestamp": "2026-12-01T10:05:03Z", "host": "order-api-7", "level": "ERROR",
                               "message": "timeout waiting for connection from pool"}]}
    key = f"{prefix}:run:{{{run}}}:call:{call}"
    cmd("HSET", key, "run_id", run, "tool_call_id", call, "tool_name", "log_search", "lifecycle", "READY",
        "evidence_status", "EVIDENCE_FOUND", "agent_result", json.dumps(projection), "raw_response", raw,
        "started_at", "2026-12-01T10:05:00Z", "finished_at", "2026-12-01T10:05:01Z")
    cmd("RPUSH", f"{prefix}:run:{{{run}}}:calls", call)
PY
}

echo "==> seeding: 2 runs x $calls calls of ~200 KB, and 20 calls with a 1 MB scope query"
seed big-1 "$calls" 100000 100000
seed big-2 "$calls" 100000 100000
seed huge-scope 20 1000000 10

HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$prefix" \
  HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=mem-token RUST_LOG=warn \
  "$BIN" serve >"$work/serve.log" 2>&1 &
pid=$!
track "$pid"
wait_ready "http://127.0.0.1:$port"

kb() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$pid/status"; }
release() { # RUN BODY
  curl -s -o "$work/answer.json" -w '%{http_code}' -X POST "http://127.0.0.1:$port/v1/runs/$1/release" \
    -H 'Authorization: Bearer mem-token' -H 'Content-Type: application/json' -d "$2"
}
stop='{"query": "Why is order-api timing out?", "stop_reason": "INFORMATION_SATURATION"}'
draft=$(python3 -c '
import json
analyses = [{"id": f"A{i}", "kind": "NORMAL", "text": "Errors show pool timeouts.", "tool_call_ids": [f"call-{i:05d}"]} for i in range(20)]
print(json.dumps({"query": "Why is order-api timing out?", "stop_reason": "FINAL_ANSWER",
  "draft": {"conclusion": {"text": "The pool is exhausted.", "analysis_refs": [a["id"] for a in analyses]}, "analyses": analyses}}))')

start=$(kb VmRSS)
echo "==> harness RSS at start: ${start} kB"
for spec in "big-1|$stop" "big-2|$stop" "huge-scope|$draft"; do
  run=${spec%%|*}
  body=${spec#*|}
  before=$(kb VmRSS)
  code=$(release "$run" "$body")
  peak=$(kb VmHWM)
  sleep 2
  after=$(kb VmRSS)
  size=$(wc -c <"$work/answer.json")
  outcome=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("outcome"), r.get("fallback_type"), "facts", len(r.get("observed_facts") or []))' "$work/answer.json")
  echo "release $run: HTTP $code, $outcome, answer $size bytes; RSS before ${before} kB, peak so far ${peak} kB (+$((peak - start)) kB over start), after ${after} kB"
done
