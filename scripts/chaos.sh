#!/usr/bin/env bash
# Chaos soak (not part of CI): REPLICAS optimised `release-harness serve` processes on one
# private Redis, driven by `release-harness soak --chaos` with the whole scenario mix, while
# this script injects faults at random intervals: kill -9 of a replica (restarted after a
# moment), Redis paused with SIGSTOP then SIGCONT, and `CLIENT KILL TYPE pubsub`. Every
# release is retried until answered; at the end the soak checks that every answer is what
# is stored, that a replay answers the same, that no run cancelled before its request was
# released, and that no lock is left behind. Exits 1 on any violation.
#   scripts/chaos.sh [DURATION_SECONDS=60] [RATE=20] [REPLICAS=2]   (BIN= another build)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
duration=${1:-60}
rate=${2:-20}
replicas=${3:-2}

work=$(mktemp -d)
trap 'redis_cont; cleanup "$work"' EXIT
redis_cont() { [ -n "${REDIS_PIDFILE:-}" ] && kill -CONT "$(cat "$REDIS_PIDFILE")" 2>/dev/null || true; }
start_redis "$work"
release_bin
bin=$BIN
prefix="chaos-$$"
model_port=$(free_port)
lease_ms=5000

ports=()
pids=()
for i in $(seq 0 $((replicas - 1))); do ports+=("$(free_port)"); pids+=(""); done

start_replica() { # INDEX
  local i=$1
  HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX="$prefix" \
    HARNESS__REDIS__LOCK_LEASE_MS="$lease_ms" HARNESS__REDIS__RESPONSE_TIMEOUT_MS=1000 \
    HARNESS__SERVER__LISTEN="127.0.0.1:${ports[$i]}" HARNESS__SERVER__API_TOKEN=chaos-token \
    HARNESS__SERVER__REPLICA_NAME="replica-$i" HARNESS__SERVER__SHUTDOWN_DRAIN_MS=1000 \
    HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" \
    HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS=1000 HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS=2500 \
    HARNESS__REPAIR__TIMEOUT_MS=1000 RUST_LOG=warn \
    "$bin" serve >>"$work/replica-$i.log" 2>&1 &
  pids[$i]=$!
  track "${pids[$i]}"
}

targets=()
for i in $(seq 0 $((replicas - 1))); do
  start_replica "$i"
  wait_ready "http://127.0.0.1:${ports[$i]}"
  targets+=(--target "http://127.0.0.1:${ports[$i]}")
done
echo "==> chaos: ${duration}s at ${rate}/s, $replicas replicas, lease ${lease_ms} ms, Redis on port $REDIS_PORT"

HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__LOCK_LEASE_MS="$lease_ms" RUST_LOG=warn \
  "$bin" soak --chaos "${targets[@]}" --token chaos-token --key-prefix "$prefix" \
  --model-listen "127.0.0.1:$model_port" --model-latency-ms 20 \
  --duration "$duration" --rate "$rate" --report-dir soak-reports >"$work/report.json" 2>"$work/soak.log" &
soak_pid=$!

kills=0 pauses=0 pubsub_cuts=0 paused_ms=0
deadline=$((SECONDS + duration))
while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$soak_pid" 2>/dev/null; do
  sleep "$(python3 -c 'import random; print(round(random.uniform(1.5, 5.0), 2))')"
  [ "$SECONDS" -lt "$deadline" ] || break
  case $((RANDOM % 3)) in
    0)
      i=$((RANDOM % replicas))
      kill -9 "${pids[$i]}" 2>/dev/null || true
      wait "${pids[$i]}" 2>/dev/null || true
      kills=$((kills + 1))
      sleep "$(python3 -c 'import random; print(round(random.uniform(0.2, 3.0), 2))')"
      start_replica "$i"
      ;;
    1)
      ms=$(python3 -c 'import random; print(random.randint(200, 6000))')
      kill -STOP "$(cat "$REDIS_PIDFILE")"
      sleep "$(python3 -c "print($ms / 1000)")"
      kill -CONT "$(cat "$REDIS_PIDFILE")"
      pauses=$((pauses + 1))
      paused_ms=$((paused_ms + ms))
      ;;
    2)
      redis-cli -p "$REDIS_PORT" CLIENT KILL TYPE pubsub >/dev/null
      pubsub_cuts=$((pubsub_cuts + 1))
      ;;
  esac
done
# Every replica up again for the soak's last retries and checks.
for i in $(seq 0 $((replicas - 1))); do
  kill -0 "${pids[$i]}" 2>/dev/null || start_replica "$i"
done
echo "==> faults injected: $kills replica kills (kill -9, then restart), $pauses Redis pauses" \
  "(SIGSTOP, ${paused_ms} ms in all), $pubsub_cuts pub/sub cuts (CLIENT KILL TYPE pubsub)"
status=0
wait "$soak_pid" || status=$?
tail -n 3 "$work/soak.log" >&2 || true
python3 - "$work/report.json" "$kills" "$pauses" "$pubsub_cuts" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
i = r.get("integrity", {})
print(f"releases {r['sent']} sent, {r['answered']} answered, {r['retries']} retries; "
      f"outcomes {r['outcomes']}")
print(f"integrity: {i.get('runs_checked')} answers checked against the store "
      f"(missing {i.get('stored_missing')}, differing {i.get('stored_differs')}), "
      f"{i.get('replays_checked')} replays (differing {i.get('replays_differ')}), "
      f"{i.get('cancelled_before_checked')} runs cancelled before their request "
      f"(released anyway {i.get('cancelled_before_released')}), "
      f"locks at drain {i.get('locks_at_drain')}, locks left after one lease {i.get('locks_left')}")
print(f"faults: {sys.argv[2]} kills, {sys.argv[3]} Redis pauses, {sys.argv[4]} pub/sub cuts; "
      f"invariant violations {len(r['violations'])}")
for v in r["violations"][:20]:
    print("  violation:", v)
print("report:", r["plot"].rsplit("/", 1)[0])
PY
exit "$status"
