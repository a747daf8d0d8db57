#!/usr/bin/env bash
# Overload (issue 31; not part of CI): one optimised `release-harness serve` on a private
# Redis, driven past its capacity by `release-harness soak --overload` (judged releases over
# h2c on 32 connections, as a fleet of agents opens them: the harness allows
# `server.h2_max_concurrent_streams`, 100, on each; each run's records seeded first), and
# the figures printed per scenario.
#
#   scenario 1  a slow model (MODEL_LATENCY_MS, 30 s) while agents send RATE1 releases/s for
#               DURATION1 s: every request is admitted or answered 503 overloaded at once;
#               peak RSS, peak open descriptors, store errors, and whether admitted releases
#               ended by their total timeout.
#   scenario 2  a fast model (instant): first the saturating throughput S (the soak capped at
#               SAT_CLIENTS releases in flight, DURATION2 s, on a replica that sheds nothing),
#               then 2 x S offered for DURATION2 s to a replica at MAX_IN_FLIGHT2: goodput
#               against S, p99 of admitted releases. Both soaks seed their runs first
#               (`soak --preseed`).
#   shed        the CPU of a shed request alone: a replica full with one release parked on a
#               model that does not answer, SHED_RATE releases/s for 16 s (h2c, 32 connections;
#               H2= for HTTP/1.1); the harness's CPU (utime + stime), system calls and context
#               switches (perf stat, if it may) over the middle 10 s per request, beside the
#               same figures for the same requests with a wrong token (401 before anything):
#               the cheapest request the harness answers at all; and, over h2c, beside a
#               bare h2 server with no harness and no actix code (examples/h2c_floor.rs:
#               tokio + h2, reads the body, answers 401): the machine's floor.
#
# The CPU per shed request is also estimated in scenario 1: the harness's CPU time (utime + stime)
# over a window in which it sheds while its admitted releases wait on the model, less the
# CPU of an equally long window after sending stopped (the same parked releases, their
# marker polls and lease renewals, no sheds), divided by the requests shed in the first.
# Scenario 2's saturation is measured with SAT_CLIENTS (128) releases in flight in the
# driver, most of whose time per release is its own seeding of the run's records, so that
# the harness, not the driver's concurrency, is the limit.
#
#   scripts/overload.sh [SCENARIOS="1 2"]
#   RATE1=1000 DURATION1=20 MODEL_LATENCY_MS=30000 MAX_IN_FLIGHT1=2048   scenario 1
#   DURATION2=15 SAT_CLIENTS=128 MAX_IN_FLIGHT2=8                        scenario 2
#   SHED_RATE=1000 H2=--http2                                            shed
#   PIN=1 ...   the harness on core 0, the soak and Redis on the others (scripts/lib.sh
#               pin_cores): the harness's figures are its own, not the driver's
#   DRIVER=path/to/release-harness ...   drives the soak with that build (no release build)
#   BIN=path/to/release-harness ...   measures another build (e.g. before), driven by this one
#       (a build without admission control ignores the new keys only if they are not set:
#       BEFORE=1 leaves them out)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
scenarios=${1:-"1 2"}
rate1=${RATE1:-1000}
duration1=${DURATION1:-20}
model_latency=${MODEL_LATENCY_MS:-30000}
max_in_flight1=${MAX_IN_FLIGHT1:-2048}
duration2=${DURATION2:-15}
sat_clients=${SAT_CLIENTS:-128}
max_in_flight2=${MAX_IN_FLIGHT2:-8}
shed_rate=${SHED_RATE:-1000}
h2=${H2---http2}

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
pin_cores
serve_bin=${BIN:-}
unset BIN
# DRIVER=path: the build that drives the soak, instead of building this checkout's.
BIN=${DRIVER:-}
release_bin
driver=$BIN
bin=${serve_bin:-$driver}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
tck=$(getconf CLK_TCK)

# start_harness NAME MAX_IN_FLIGHT: starts `serve` (h2c accepted, the model over HTTP/1.1)
# and sets PORT, MODEL_PORT, PID, BASE, PREFIX.
start_harness() {
  local name=$1 limit=$2
  PORT=$(free_port)
  MODEL_PORT=$(free_port)
  PREFIX="overload-$name-$$"
  BASE="http://127.0.0.1:$PORT"
  local limits=()
  [ -n "${BEFORE:-}" ] || limits=(HARNESS__SERVER__MAX_IN_FLIGHT="$limit")
  # The shed scenario's one admitted release waits as long as the measurement lasts.
  [ "$name" != shed ] || limits+=(HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS=600000
    HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS=600000)
  env HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$PREFIX" \
    HARNESS__SERVER__LISTEN="127.0.0.1:$PORT" HARNESS__SERVER__API_TOKEN=overload-token \
    HARNESS__SERVER__ACCEPT_H2C=true HARNESS__MODEL__BASE_URL="http://127.0.0.1:$MODEL_PORT" \
    "${limits[@]}" RUST_LOG=error "${HARNESS_PIN[@]}" "$bin" serve >"$work/serve-$name.log" 2>&1 &
  PID=$!
  track "$PID"
  wait_ready "$BASE"
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
metric_sum() { curl -s "$BASE/metrics" | awk -v m="$1" 'index($1, m) == 1 && ($1 == m || substr($1, length(m) + 1, 1) == "{") {s += $2} END {print s + 0}'; }

# soak NAME RATE DURATION CLIENT_CAP LATENCY [TOKEN]: the soak against the running harness.
soak() {
  HARNESS__REDIS__URL="$REDIS_URL" RUST_LOG=error "${LOAD_PIN[@]}" "$driver" soak --overload --only supported \
    --target "$BASE" --token "${6:-overload-token}" --key-prefix "$PREFIX" \
    --model-listen "127.0.0.1:$MODEL_PORT" --model-latency-ms "$5" --rate "$2" \
    --duration "$3" --max-in-flight "$4" ${h2} --no-audit --pid "$PID" ${PRESEED:-} \
    --report-dir "$work/reports-$1" >"$work/report-$1.json" 2>"$work/soak-$1.log" || true
}

figure() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

for scenario in $scenarios; do
  case $scenario in
  1)
    echo "==> scenario 1: model ${model_latency} ms per answer, ${rate1} releases/s for ${duration1} s, server.max_in_flight ${max_in_flight1} ($bin)"
    start_harness s1 "$max_in_flight1"
    soak s1 "$rate1" "$duration1" 1000000 "$model_latency" &
    soak_pid=$!
    # The CPU window: from 5 s in (the replica is full) to 1 s before sending stops.
    sleep 5
    c0=$(cpu_ticks "$PID"); s0=$(metric_sum harness_shed_total)
    window=$(( duration1 > 7 ? duration1 - 6 : 1 ))
    sleep "$window"
    c1=$(cpu_ticks "$PID"); s1=$(metric_sum harness_shed_total)
    # The same parked releases with nothing to shed: from 2 s after sending stops.
    sleep 8
    c2=$(cpu_ticks "$PID"); s2=$(metric_sum harness_shed_total)
    sleep "$window"
    c3=$(cpu_ticks "$PID"); s3=$(metric_sum harness_shed_total)
    wait "$soak_pid" || true
    store_errors=$(metric_sum harness_store_errors_total)
    total_timeout=45000
    python3 - "$work/report-s1.json" "$c0" "$c1" "$s0" "$s1" "$tck" "$store_errors" "$total_timeout" "$max_in_flight1" "$c2" "$c3" "$s2" "$s3" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c0, c1, s0, s1, tck = (float(x) for x in sys.argv[2:7])
store_errors, total_timeout, limit = float(sys.argv[7]), float(sys.argv[8]), int(sys.argv[9])
c2, c3, s2, s3 = (float(x) for x in sys.argv[10:14])
o = r.get("overload") or {}
shed_cpu = ((c1 - c0) - (c3 - c2)) / tck / max(s1 - s0, 1) * 1e6
upper = (c1 - c0) / tck / max(s1 - s0, 1) * 1e6
quiet = (c3 - c2) / tck
lat, shed = r["latency_ms"], o.get("shed_latency_ms", {})
print(f"  sent {r['sent']}, answered {r['answered']}: admitted {o.get('admitted')} (200), "
      f"shed {o.get('shed')} (503 overloaded; {o.get('shed_without_retry_after')} without Retry-After), "
      f"503 store errors {o.get('store_errors')}, other {o.get('other_errors')}")
print(f"  shed answers: p50 {shed.get('p50', 0):.1f} ms, p99 {shed.get('p99', 0):.1f} ms, max {shed.get('max', 0):.1f} ms")
print(f"  admitted releases: p50 {lat['p50'] / 1000:.1f} s, p99 {lat['p99'] / 1000:.1f} s, max {lat['max'] / 1000:.1f} s "
      f"(total timeout {total_timeout / 1000:.0f} s); outcomes {r['outcomes']}")
print(f"  harness peak RSS {r['rss_max_kb'] / 1024:.0f} MB, peak open descriptors {o.get('fds_max')}, "
      f"harness_store_errors_total {store_errors:.0f}")
print(f"  CPU per shed request: {shed_cpu:.1f} us ({upper:.1f} us with the parked releases' own work; "
      f"{s1 - s0:.0f} sheds; the quiet window: {s3 - s2:.0f} sheds, {quiet:.2f} s CPU)")
for v in r["violations"][:5]:
    print(f"  violation: {v}")
PY
    kill "$PID"; wait "$PID" 2>/dev/null || true
    ;;
  2)
    echo "==> scenario 2: instant model; saturation with ${sat_clients} releases in flight (server.max_in_flight ${sat_clients}), then 2x it at server.max_in_flight ${max_in_flight2}, ${duration2} s each ($bin)"
    # S: the replica's throughput with nothing shed (its limit as high as the driver's).
    start_harness sat "$sat_clients"
    c0=$(cpu_ticks "$PID")
    PRESEED=--preseed soak sat 3000 "$duration2" "$sat_clients" 0
    c1=$(cpu_ticks "$PID")
    sat=$(figure "$work/report-sat.json" 'round(r["overload"]["admitted"] / r["duration_s"], 1)')
    sat_answered=$(figure "$work/report-sat.json" 'r["overload"]["admitted"]')
    sat_p99=$(figure "$work/report-sat.json" 'round(r["latency_ms"]["p99"], 1)')
    kill "$PID"; wait "$PID" 2>/dev/null || true
    offered=$(python3 -c "print(round(2 * $sat, 1))")
    start_harness s2 "$max_in_flight2"
    PRESEED=--preseed soak over "$offered" "$duration2" 1000000 0
    store_errors=$(metric_sum harness_store_errors_total)
    python3 - "$work/report-over.json" "$sat" "$sat_answered" "$c0" "$c1" "$tck" "$store_errors" "$offered" "$sat_p99" "$sat_clients" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
sat, sat_answered = float(sys.argv[2]), float(sys.argv[3])
c0, c1, tck = (float(x) for x in sys.argv[4:7])
store_errors, offered = float(sys.argv[7]), float(sys.argv[8])
sat_p99, sat_clients = sys.argv[9], int(sys.argv[10])
o = r["overload"]
per_release = (c1 - c0) / tck / max(sat_answered, 1)
lat = r["latency_ms"]
print(f"  saturating throughput S = {sat:.0f} releases/s ({per_release * 1e6:.0f} us of harness CPU per release; "
      f"p99 {sat_p99} ms with {sat_clients} in flight)")
print(f"  offered {offered:.0f}/s: sent {r['sent']}, admitted {o['admitted']}, shed {o['shed']} "
      f"({o['shed_without_retry_after']} without Retry-After), 503 store errors {o['store_errors']}, other {o['other_errors']}")
print(f"  goodput {o['goodput_per_s']:.0f}/s = {100 * o['goodput_per_s'] / max(sat, 1):.0f}% of S; "
      f"admitted p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms; "
      f"shed answers p99 {o['shed_latency_ms']['p99']:.1f} ms")
print(f"  harness peak RSS {r['rss_max_kb'] / 1024:.0f} MB, "
      f"harness_store_errors_total {store_errors:.0f}")
for v in r["violations"][:5]:
    print(f"  violation: {v}")
PY
    kill "$PID"; wait "$PID" 2>/dev/null || true
    ;;
  shed)
    echo "==> shed: a full replica (server.max_in_flight 1, its release parked) sent ${shed_rate} releases/s, ${h2:-HTTP/1.1} ($bin)"
    start_harness shed 1
    # The bare h2c floor (examples/h2c_floor.rs): no harness, no actix; h2c only.
    floor_bin=""
    if [ -n "$h2" ]; then
      cargo build --release --locked --quiet --example h2c_floor
      floor_bin=target/release/examples/h2c_floor
    fi
    for token in overload-token wrong-token floor; do
      server=$PID target=$BASE count=(metric_sum harness_http_requests_total)
      if [ "$token" = floor ]; then
        [ -n "$floor_bin" ] || continue
        floor_port=$(free_port)
        "${HARNESS_PIN[@]}" "$floor_bin" "127.0.0.1:$floor_port" &
        server=$!
        track "$server"
        target="http://127.0.0.1:$floor_port"
        count=(curl -s --http2-prior-knowledge "$target/requests")
        sleep 0.5
      fi
      BASE=$target soak "shed-$token" "$shed_rate" 16 1000000 600000 "$token" &
      soak_pid=$!
      sleep 4
      requests0=$("${count[@]}")
      u0=$(awk '{print $14}' "/proc/$server/stat"); k0=$(awk '{print $15}' "/proc/$server/stat")
      # System calls and context switches, where perf may count them (root, or
      # kernel.perf_event_paranoid <= 1); otherwise only the CPU time.
      if perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$server" \
        -o "$work/perf-$token.csv" -- sleep 10 >/dev/null 2>&1; then :; else sleep 10; fi
      u1=$(awk '{print $14}' "/proc/$server/stat"); k1=$(awk '{print $15}' "/proc/$server/stat")
      requests1=$("${count[@]}")
      # The soak's own process (and its fake model, which holds the parked release) ends
      # with the window.
      pkill -TERM -P "$soak_pid" 2>/dev/null || true
      wait "$soak_pid" 2>/dev/null || true
      [ "$token" != floor ] || { kill "$server"; wait "$server" 2>/dev/null || true; }
      python3 - "$token" "$u0" "$u1" "$k0" "$k1" "$requests0" "$requests1" "$tck" "$work/perf-$token.csv" <<'PY'
import os, sys
token = sys.argv[1]
u0, u1, k0, k1, r0, r1, tck = (float(x) for x in sys.argv[2:9])
n = max(r1 - r0, 1)
what = {"overload-token": "shed (503 overloaded)", "wrong-token": "refused (401)",
        "floor": "bare h2c 401 (no harness)"}[token]
line = (f"  {what:26}: {n:.0f} requests in 10 s; CPU {((u1 - u0) + (k1 - k0)) / tck / n * 1e6:.0f} us "
        f"per request (user {(u1 - u0) / tck / n * 1e6:.0f}, system {(k1 - k0) / tck / n * 1e6:.0f})")
counts = {}
if os.path.exists(sys.argv[9]):
    for row in open(sys.argv[9]):
        cells = row.strip().split(",")
        if len(cells) > 2 and cells[0].replace(".", "").isdigit():
            counts[cells[2]] = float(cells[0])
if counts:
    line += (f"; {counts.get('raw_syscalls:sys_enter', 0) / n:.1f} system calls, "
             f"{counts.get('context-switches', 0) / n:.1f} context switches per request")
print(line)
PY
      sleep 2
    done
    kill "$PID"; wait "$PID" 2>/dev/null || true
    ;;
  esac
done
