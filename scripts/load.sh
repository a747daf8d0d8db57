#!/usr/bin/env bash
# Load test of judged releases (not part of CI): optimised `release-harness serve` replicas on
# a private store, driven by `release-harness soak --only supported --target ...` at fixed
# request rates against the soak's instant fake model (no added latency). The harness and the
# load generator are separate processes sharing this machine's cores.
#   scripts/load.sh [DURATION_SECONDS=60] [RATE ...=100 200 400]
#   LOAD_STORE=cluster scripts/load.sh ...   the store is a private Redis Cluster (3 masters +
#                                            3 replicas) instead of one redis-server
#   LOAD_REPLICAS=2 scripts/load.sh ...      harness replicas behind the load (round-robin)
#   BIN=path/to/release-harness scripts/load.sh ...   measures another build (e.g. an older
#   commit's, for a before/after comparison in one session; its soak driver is used too)
#   PIN=1 scripts/load.sh ...   one harness with one worker on core 0; Redis, the fake model
#                               and the load on the other cores (issue 11's measurement)
# Prints one line per rate: throughput, release latency p50/p99, harness overhead p50/p99
# and the (first) harness's RSS; the reports are under soak-reports/.
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

store=${LOAD_STORE:-single}
replicas=${LOAD_REPLICAS:-1}

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
case $store in
  single)
    start_redis "$work"
    store_env=(HARNESS__REDIS__URL="$REDIS_URL")
    where="Redis on port $REDIS_PORT"
    ;;
  cluster)
    start_redis_cluster "$work"
    store_env=(HARNESS__REDIS__URL= HARNESS__REDIS__CLUSTER_NODES="$CLUSTER_NODES")
    where="Redis Cluster (3 masters + 3 replicas) on ports ${CLUSTER_PORTS[*]}"
    ;;
  *) echo "LOAD_STORE is single or cluster" >&2; exit 2 ;;
esac
pin_cores
pinned=()
if [ -n "${PIN:-}" ]; then
  [ "$replicas" -eq 1 ] || { echo "PIN=1 measures one replica" >&2; exit 2; }
  pinned=(HARNESS__SERVER__WORKERS=1)
fi
release_bin
bin=$BIN
echo "==> load: ${duration}s per rate, rates ${rates[*]}/s, $(nproc) cores, $replicas harness replica(s), $where"

for rate in "${rates[@]}"; do
  model_port=$(free_port)
  prefix="load-$rate-$$"
  targets=()
  serve_pids=()
  for i in $(seq 1 "$replicas"); do
    port=$(free_port)
    env "${store_env[@]}" "${pinned[@]}" HARNESS__REDIS__KEY_PREFIX="$prefix" \
      HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=load-token \
      HARNESS__SERVER__REPLICA_NAME="load-$i" \
      HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" RUST_LOG=warn \
      "${HARNESS_PIN[@]}" "$bin" serve >"$work/serve-$rate-$i.log" 2>&1 &
    serve_pids+=($!)
    track "$!"
    wait_ready "http://127.0.0.1:$port"
    targets+=(--target "http://127.0.0.1:$port")
  done
  env "${store_env[@]}" RUST_LOG=warn "${LOAD_PIN[@]}" "$bin" soak --only supported \
    "${targets[@]}" --token load-token --key-prefix "$prefix" \
    --model-listen "127.0.0.1:$model_port" --model-latency-ms 0 --pid "${serve_pids[0]}" \
    --duration "$duration" --rate "$rate" --report-dir soak-reports >"$work/report-$rate.json" \
    || echo "rate $rate/s: the soak reported invariant violations (listed below)"
  for pid in "${serve_pids[@]}"; do kill "$pid"; wait "$pid" 2>/dev/null || true; done
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
