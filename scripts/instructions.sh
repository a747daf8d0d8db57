#!/usr/bin/env bash
# Instructions per release (not part of CI): user-space instructions the harness process
# executes per release, counted by callgrind, so the figure does not depend on machine noise
# and is the one to compare from change to change.
#
# For each kind of release, an optimised `release-harness serve` runs under
# `valgrind --tool=callgrind` twice, on a private Redis, driven by
# `release-harness soak --only SCENARIO` with the soak's instant fake model: once for a few
# releases and once for 1,000 more. The figure is (I(long run) - I(short run)) / (releases
# between them), so start-up and shutdown cancel out. The soak only sends the releases
# (`--no-audit`): it does not also fetch each run's audit, which is not part of a release
# (figures before 2026-12-04 counted that GET too; WITH_AUDIT=1 measures that way).
#   judged         `supported`: one SemanticGuard call, released SUCCESS
#   deterministic  `no_conclusion`: records loaded and guarded, no model call
#                  (INSUFFICIENT_EVIDENCE)
# Counting starts when the server answers /readyz (`--instr-atstart=no`, then
# `callgrind_control -i on`): start-up varied by millions of instructions from run to run
# (the metrics exporter's clock calibration alone by up to 9 M), up to 9,000 per release
# over 1,000 releases. Until 2026-12-05 start-up was counted and left to cancel out. What
# still varies is the server's idle work while the soak starts and stops (timers,
# allocator decay).
# Usage: scripts/instructions.sh [EXTRA_RELEASES=1000]
#        BIN=path/to/release-harness scripts/instructions.sh   (another build serves, e.g.
#                         before; this checkout's build drives it)
#        WITH_AUDIT=1 ...   the soak also fetches every run's audit, as it does by default
#        SCENARIOS="repaired" ...   other soak scenarios (e.g. `repaired`: one repair call,
#                         then one judge call)
#        SCENARIOS="shed" ...  a full replica's `503 overloaded` (issue 31): serve with
#                         server.max_in_flight 1 and an 8 s total timeout, the one admitted
#                         release parked on a model that answers after 60 s, driven at
#                         200 requests/s: per shed request (each also reads Redis once for a
#                         stored result)
#        H2=1 ...         the releases and the model calls over h2c (HTTP/2, prior knowledge)
#        DRIVER=path ...  this build drives the soak (no release build of this checkout;
#                         e.g. the `before` build, while comparing profiling builds)
#        VECTOR_STRINGS=1 ...  glibc's memset and memcpy use vector stores at every size,
#                         not `rep stosb`/`rep movsb` above about 2 kB: callgrind counts
#                         each byte a rep string instruction moves as one instruction (a
#                         3 kB memset counts 3,088 where the vector loop counts about 100,
#                         and the CPU takes tens of cycles either way). For a second figure
#                         beside the plain one, never instead of it.
#        ANNOTATE=1 ...   also keeps the long runs' profiles in soak-reports/ and prints
#                         their top functions (build with `--profile profiling` for symbols)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
extra=${1:-1000}
need_pkg valgrind valgrind

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
serve_bin=${BIN:-}
unset BIN
# DRIVER=path: the build that drives the soak, instead of building this checkout's.
BIN=${DRIVER:-}
release_bin
driver=$BIN
bin=${serve_bin:-$driver}
# The thresholds above which glibc (x86-64) switches to rep string instructions.
tunables=${GLIBC_TUNABLES:-}
if [ -n "${VECTOR_STRINGS:-}" ]; then
  big=$((1 << 40))
  tunables="glibc.cpu.x86_rep_stosb_threshold=$big:glibc.cpu.x86_rep_movsb_threshold=$big"
fi
h2=false
[ -n "${H2:-}" ] && h2=true

# run_count SCENARIO SECONDS: one callgrind'ed serve driven at 20 releases/s for SECONDS;
# prints "instructions answered".
run_count() {
  local scenario=$1 seconds=$2 port model_port prefix out pid
  local only=$scenario rate=20 latency=0 shed_env=() soak_flags=()
  if [ "$scenario" = shed ]; then
    only=supported rate=200 latency=60000 soak_flags=(--overload)
    shed_env=(HARNESS__SERVER__MAX_IN_FLIGHT=1 HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS=8000)
  fi
  port=$(free_port)
  model_port=$(free_port)
  prefix="ins-$scenario-$seconds-$$"
  out="$work/callgrind.$scenario.$seconds"
  HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$prefix" \
    HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=ins-token \
    HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" RUST_LOG=warn \
    HARNESS__MODEL__HTTP2_PRIOR_KNOWLEDGE="$h2" HARNESS__SERVER__ACCEPT_H2C="$h2" \
    env "${shed_env[@]}" ${tunables:+GLIBC_TUNABLES="$tunables"} valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$bin" serve \
    >"$work/serve-$scenario-$seconds.log" 2>&1 &
  pid=$!
  track "$pid"
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  # Counting starts once the server is ready: start-up (the metrics exporter's clock
  # calibration alone varies by millions of instructions) is not counted at all.
  callgrind_control -i on "$pid" >/dev/null
  HARNESS__REDIS__URL="$REDIS_URL" RUST_LOG=warn "$driver" soak --only "$only" \
    --target "http://127.0.0.1:$port" --token ins-token --key-prefix "$prefix" \
    --model-listen "127.0.0.1:$model_port" --model-latency-ms "$latency" "${soak_flags[@]}" \
    --duration "$seconds" --rate "$rate" --report-dir "$work/reports" $([ -n "${WITH_AUDIT:-}" ] || echo --no-audit) \
    ${H2:+--http2} \
    >"$work/report-$scenario-$seconds.json" 2>"$work/soak-$scenario-$seconds.log" \
    || { echo "the soak of $scenario reported violations:" >&2; cat "$work/report-$scenario-$seconds.json" >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  local total answered
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out")
  answered=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["answered"])' \
    "$work/report-$scenario-$seconds.json")
  echo "$total $answered"
}

echo "==> instructions per release (callgrind), $bin, Redis on port $REDIS_PORT"
long=$(( 1 + extra / 20 ))
for scenario in ${SCENARIOS:-supported no_conclusion}; do
  read -r i1 n1 < <(run_count "$scenario" 1)
  read -r i2 n2 < <(run_count "$scenario" "$long")
  python3 - "$scenario" "$i1" "$n1" "$i2" "$n2" <<'PY'
import sys
scenario, i1, n1, i2, n2 = sys.argv[1], *map(int, sys.argv[2:])
kind = {"supported": "judged", "no_conclusion": "deterministic"}.get(scenario, scenario)
what = "shed request" if scenario == "shed" else "release"
per = (i2 - i1) / (n2 - n1)
print(f"{kind:13} ({scenario}): {per:,.0f} instructions per {what} "
      f"(I({n2}) = {i2:,} - I({n1}) = {i1:,}, over {n2 - n1} {what}s)")
PY
  if [ -n "${ANNOTATE:-}" ]; then
    mkdir -p soak-reports
    cp "$work/callgrind.$scenario.$long" "soak-reports/callgrind.$scenario.out"
    cp "$work/callgrind.$scenario.1" "soak-reports/callgrind.$scenario.short.out"
    echo "   (callgrind profile of the long run: soak-reports/callgrind.$scenario.out)"
    { callgrind_annotate --inclusive=yes "soak-reports/callgrind.$scenario.out" 2>/dev/null || true; } \
      | grep -E 'release_harness|serde_json|redis::|combine|async_openai|reqwest|hyper::|actix_web|actix_http|malloc|free|memcpy' \
      | head -60 || true
  fi
done
