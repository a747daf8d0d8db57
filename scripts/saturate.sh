#!/usr/bin/env bash
# Saturating throughput of judged releases by worker count: `scripts/load.sh saturate`
# (see there). Not part of CI.
#   scripts/saturate.sh [DURATION_SECONDS=20] [CONNECTIONS=16] [WORKERS ...=1 2]
#   PIN=1 ...   the harness on core 0, Redis, the fake model and wrk on the others
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
duration=${1:-20}
connections=${2:-16}
shift 2 || shift $# || true
workers=("$@")
[ ${#workers[@]} -gt 0 ] || workers=(1 2)
need_pkg wrk wrk

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
pin_cores
release_bin
bin=$BIN
model_port=$(free_port)
"${LOAD_PIN[@]}" "$bin" fake-model --listen "127.0.0.1:$model_port" >"$work/model.log" 2>&1 &
track $!
# Runs per wrk thread, enough for 5,000 releases/s for the whole duration.
per_thread=$(( duration * 2500 + 1000 ))
echo "==> saturate: ${duration}s per worker count, $connections connections, $(nproc) cores, workers ${workers[*]}"

# seed PREFIX: the template run's records under sat-T-N for both wrk threads (RESP pipe).
seed() {
  python3 - "$1" "$per_thread" <<'PY' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
import json, sys
prefix, per_thread = sys.argv[1], int(sys.argv[2])
bundle = json.load(open("examples/runs/success-supported.json"))
out = sys.stdout.buffer
def cmd(*args):
    parts = [str(a).encode() for a in args]
    out.write(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
for t in (0, 1):
    for n in range(1, per_thread + 1):
        run = f"sat-{t}-{n}"
        for inv in bundle["invocations"]:
            fields = dict(inv, run_id=run)
            cmd("HSET", f"{prefix}:run:{{{run}}}:call:{inv['tool_call_id']}",
                *[x for kv in fields.items() for x in kv])
            cmd("RPUSH", f"{prefix}:run:{{{run}}}:calls", inv["tool_call_id"])
PY
}

python3 - >"$work/body.json" <<'PY'
import json
b = json.load(open("examples/runs/success-supported.json"))
print(json.dumps({"query": b["query"], "draft": b["draft"], "stop_reason": b["stop_reason"]}))
PY
cat >"$work/release.lua" <<'LUA'
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function init(args)
  n = 0
  local f = io.open(args[1])
  body = f:read("*a")
  f:close()
  headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer sat-token"}
end
function request()
  n = n + 1
  return wrk.format("POST", "/v1/runs/sat-" .. tid .. "-" .. n .. "/release", headers, body)
end
function done(summary, latency, requests)
  io.write(string.format("WRK %d %d %.3f %.3f %.3f %d\n", summary.requests, summary.duration,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
LUA

for w in "${workers[@]}"; do
  prefix="sat-$w-$$"
  seed "$prefix"
  port=$(free_port)
  HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$prefix" \
    HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=sat-token \
    HARNESS__SERVER__WORKERS="$w" HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" \
    RUST_LOG=warn "${HARNESS_PIN[@]}" "$bin" serve >"$work/serve-$w.log" 2>&1 &
  pid=$!
  track "$pid"
  wait_ready "http://127.0.0.1:$port"
  cpu_before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  threads_before=$(for t in /proc/$pid/task/*; do echo "$(cat "$t/comm" | tr ' ' '_')#$(basename "$t") $(awk '{print $14 + $15}' "$t/stat")"; done)
  "${LOAD_PIN[@]}" wrk -t2 -c"$connections" -d"${duration}s" --timeout 10s -s "$work/release.lua" \
    "http://127.0.0.1:$port" -- "$work/body.json" >"$work/wrk-$w.txt" 2>&1 || true
  cpu_after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  threads_after=$(for t in /proc/$pid/task/*; do echo "$(cat "$t/comm" | tr ' ' '_')#$(basename "$t") $(awk '{print $14 + $15}' "$t/stat")"; done)
  # CPU per thread name (the worker threads, the system arbiter, tokio's blocking pool).
  threads=$(python3 - "$threads_before" "$threads_after" "$(getconf CLK_TCK)" <<'PY'
import collections, sys
def read(text):
    out = collections.Counter()
    for line in text.splitlines():
        name, ticks = line.rsplit(" ", 1)
        out[name] += int(ticks)
    return out
before, after, tck = read(sys.argv[1]), read(sys.argv[2]), int(sys.argv[3])
used = {k: (after[k] - before.get(k, 0)) / tck for k in after}
print(", ".join(f"{k} {v:.1f}s" for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= 0.1))
PY
)
  cpu=$(( (cpu_after - cpu_before) * 100 / $(getconf CLK_TCK) ))
  outcomes=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^harness_releases_total\{/ && $2 > 0 {printf "%s=%d ", $1, $2}')
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  read -r _ requests micros p50 p99 max errors < <(grep '^WRK ' "$work/wrk-$w.txt")
  python3 - "$w" "$requests" "$micros" "$p50" "$p99" "$max" "$errors" "$cpu" "$outcomes" <<'PY'
import sys
w, requests, micros = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p50, p99, mx, errors = *map(float, sys.argv[4:7]), int(sys.argv[7])
cpu, outcomes = int(sys.argv[8]) / 100, sys.argv[9]
seconds = micros / 1e6
print(f"workers {w}: {requests / seconds:.0f} releases/s ({requests} in {seconds:.1f} s), "
      f"latency p50 {p50:.2f} ms p99 {p99:.2f} ms max {mx:.2f} ms, errors {errors}; harness CPU "
      f"{100 * cpu / seconds:.0f}% of one core, {1e6 * cpu / max(requests, 1):.0f} us per release; "
      f"{outcomes.strip()}")
PY
  echo "  harness CPU by thread: $threads"
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
done
