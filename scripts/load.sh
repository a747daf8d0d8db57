#!/usr/bin/env bash
# Load test of judged releases (not part of CI): an optimised `release-harness serve` on a
# private Redis, driven by `release-harness soak --only supported --target ...` at fixed
# request rates against the soak's instant fake model (no added latency). The harness and the
# load generator are separate processes sharing this machine's cores.
#   scripts/load.sh [DURATION_SECONDS=60] [RATE ...=100 200 400]
#   BIN=path/to/release-harness scripts/load.sh ...   measures another build (e.g. an older
#   commit's, for a before/after comparison in one session; its soak driver is used too)
# Prints one line per rate: throughput, release latency p50/p99, harness overhead p50/p99
# and the harness's RSS; the reports are under soak-reports/.
#
#   scripts/load.sh saturate [DURATION_SECONDS=20] [CONNECTIONS=16] [WORKERS ...=1 2]
# Saturating throughput: for each worker count (server.workers), a fresh harness is driven
# by `wrk` with CONNECTIONS keep-alive connections sending judged releases as fast as it
# answers (each of a distinct run, pre-seeded in Redis from examples/runs/success-supported
# .json, so every request is a whole judged release: begin, load, guards, one judge call to
# `release-harness fake-model`, commit). All in one run, side by side on this machine: one
# line per worker count with releases/s and wrk's latency percentiles.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
if [ "${1:-}" = saturate ]; then
  shift
  exec bash scripts/saturate.sh "$@"
fi
duration=${1:-60}
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(100 200 400)

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
release_bin
bin=$BIN
echo "==> load: ${duration}s per rate, rates ${rates[*]}/s, $(nproc) cores, Redis on port $REDIS_PORT"

for rate in "${rates[@]}"; do
  port=$(free_port)
  model_port=$(free_port)
  prefix="load-$rate-$$"
  HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$prefix" \
    HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=load-token \
    HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" RUST_LOG=warn \
    "$bin" serve >"$work/serve-$rate.log" 2>&1 &
  serve_pid=$!
  track "$serve_pid"
  wait_ready "http://127.0.0.1:$port"
  HARNESS__REDIS__URL="$REDIS_URL" RUST_LOG=warn "$bin" soak --only supported \
    --target "http://127.0.0.1:$port" --token load-token --key-prefix "$prefix" \
    --model-listen "127.0.0.1:$model_port" --model-latency-ms 0 --pid "$serve_pid" \
    --duration "$duration" --rate "$rate" --report-dir soak-reports >"$work/report-$rate.json" \
    || echo "rate $rate/s: the soak reported invariant violations (listed below)"
  kill "$serve_pid"
  wait "$serve_pid" 2>/dev/null || true
  python3 - "$rate" "$work/report-$rate.json" <<'PY'
import json, sys
rate, r = sys.argv[1], json.load(open(sys.argv[2]))
l, o = r["latency_ms"], r["overhead_ms"]
print(f"rate {rate}/s: throughput {r['throughput_per_s']:.1f}/s, answered {r['answered']}/{r['sent']}, "
      f"latency p50 {l['p50']:.2f} ms p99 {l['p99']:.2f} ms, overhead p50 {o['p50']:.2f} ms "
      f"p99 {o['p99']:.2f} ms, harness RSS {r['rss_start_kb']} -> {r['rss_end_kb']} kB, "
      f"violations {len(r['violations'])}, report {r['plot'].rsplit('/', 1)[0]}")
for v in r["violations"][:5]:
    print("  violation:", v)
PY
done
