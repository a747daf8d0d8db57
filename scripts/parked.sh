#!/usr/bin/env bash
# Memory of parked releases (not part of CI): an optimised `release-harness serve` on a
# private Redis; PARKED judged releases sent at once to a fake model that answers only after
# LATENCY ms, so that they all wait on the model together. Prints the harness's RSS after a
# warm-up, with every release parked (and the cost per parked release), and after they all
# finished, with the releases and actors still alive.
#   scripts/parked.sh [PARKED=1000] [LATENCY_MS=15000]
#   BIN=path/to/release-harness scripts/parked.sh ...   measures another build
#   H2=1 scripts/parked.sh ...   the releases are sent over h2c (HTTP/2 with prior knowledge,
#       multiplexed on a few connections) and the harness asks the model over h2c
#       (model.http2_prior_knowledge), instead of one HTTP/1.1 connection per release each way
#   DHAT=1 scripts/parked.sh 200 60000   also runs the harness under valgrind's DHAT (built
#       without jemalloc, `--no-default-features`), stops it while the releases are parked and
#       prints where the bytes live at the heap's peak, by allocation site (soak-reports/dhat.json)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
parked=${1:-1000}
latency=${2:-15000}
work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
if [ -n "${DHAT:-}" ] && [ -z "${BIN:-}" ]; then
  need_pkg valgrind valgrind
  cargo build --release --locked --quiet --no-default-features --bin release-harness \
    --target-dir target/system-alloc
  BIN=target/system-alloc/release/release-harness
fi
release_bin
runner=()
[ -n "${DHAT:-}" ] && runner=(valgrind --tool=dhat --dhat-out-file="$work/dhat.json")
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
prefix="parked-$$"
h2=false
[ -n "${H2:-}" ] && h2=true
port=$(free_port)
model_port=$(free_port)
base="http://127.0.0.1:$port"

HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$prefix" \
  HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=parked-token \
  HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" \
  HARNESS__MODEL__HTTP2_PRIOR_KNOWLEDGE="$h2" HARNESS__SERVER__ACCEPT_H2C="$h2" \
  HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS=300000 \
  HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS=600000 RUST_LOG=warn \
  "${runner[@]}" "$BIN" serve >"$work/serve.log" 2>&1 &
pid=$!
track "$pid"
wait_ready "$base"

kb() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$pid/status"; }
gauge() { curl -s "$base/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
# drive RATE SECONDS LATENCY: judged releases from the soak (its own fake model).
drive() {
  HARNESS__REDIS__URL="$REDIS_URL" RUST_LOG=warn "$BIN" soak --only supported --target "$base" \
    --token parked-token --key-prefix "$prefix" --model-listen "127.0.0.1:$model_port" \
    --model-latency-ms "$3" --rate "$1" --duration "$2" --max-in-flight $((parked * 2)) \
    --report-dir "$work/reports" ${H2:+--http2} >"$work/soak-$3.json" 2>"$work/soak-$3.log"
}

echo "==> warm-up: 200 judged releases with an instant model"
drive 200 1 0
sleep 1
warm=$(kb VmRSS)
echo "harness RSS after the warm-up: $warm kB"

echo "==> $parked judged releases parked on a model that answers after $latency ms"
drive "$parked" 1 "$latency" &
driver=$!
track "$driver"
in_flight=0
polls=300
[ -n "${DHAT:-}" ] && polls=3000 # under valgrind the releases take longer to arrive
for _ in $(seq 1 "$polls"); do
  in_flight=$(gauge harness_runs_in_flight)
  [ "${in_flight%.*}" -ge "$parked" ] 2>/dev/null && break
  sleep 0.1
done
sleep 1
parked_kb=$(kb VmRSS)
python3 - "$parked" "$warm" "$parked_kb" "$in_flight" <<'PY'
import sys
n, warm, parked, in_flight = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print(f"harness RSS with {in_flight} releases in flight: {parked} kB "
      f"(+{parked - warm} kB): {(parked - warm) / n:.1f} kB per parked release")
PY
if [ -n "${DHAT:-}" ]; then
  # The heap's peak is now: stop the harness so that DHAT writes its profile.
  kill -KILL "$driver" 2>/dev/null || true
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  mkdir -p soak-reports
  cp "$work/dhat.json" soak-reports/dhat.json
  python3 scripts/dhat-sites.py soak-reports/dhat.json "$parked"
  exit 0
fi
wait "$driver" || echo "the soak reported violations: $(cat "$work/soak-$latency.json" | head -c 2000)"
sleep 2
after=$(kb VmRSS)
echo "after they finished: RSS $after kB (+$((after - warm)) kB over the warm-up), runs in flight $(gauge harness_runs_in_flight)"
sleep 15
rested=$(kb VmRSS)
echo "17 s after they finished: RSS $rested kB (+$((rested - warm)) kB over the warm-up)"
python3 - "$work/soak-$latency.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"answered {r['answered']}/{r['sent']}, outcomes {r.get('outcomes')}, violations {len(r['violations'])}")
PY
