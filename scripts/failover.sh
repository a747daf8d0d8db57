#!/usr/bin/env bash
# Failover under load (not part of CI): a private Redis Cluster (3 masters + 3 replicas,
# cluster-node-timeout 1 s), two optimised `release-harness serve` replicas on it, and a
# steady load of judged releases (`release-harness soak --chaos --only supported`, which
# retries a 503/409 until answered and checks at the end that every 200 answer is what is
# stored). After KILL_AT seconds one master is killed with kill -9; the cluster promotes its
# replica; once it has, the killed node is started again (as an orchestrator would) and
# rejoins as a replica. Meanwhile a probe releases a fresh run on the killed master's slots
# every 100 ms (a controlled stop, no model call), alternating between the two harness
# replicas, neither of which is restarted.
# Loss needs a write the master acknowledged and had not yet sent to its replica when it died:
# on loopback that window is microseconds (the reply and the replication stream leave in the
# same event-loop turn), so with min_replicas_ack=0 the count is usually 0 here; on a real
# network, or with a lagging replica, it is not.
#   scripts/failover.sh [MIN_REPLICAS_ACK=0] [DURATION_SECONDS=40] [RATE=50] [KILL_AT=10]
# Prints the promotion time, the gap (kill -9 to the first 200 on the killed master's slots),
# and the answers lost: answered 200 but missing or different in the store afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
acks=${1:-0}
duration=${2:-40}
rate=${3:-50}
kill_at=${4:-10}

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis_cluster "$work"
release_bin
bin=$BIN
prefix="failover-$$"
model_port=$(free_port)
store_env=(HARNESS__REDIS__URL= HARNESS__REDIS__CLUSTER_NODES="$CLUSTER_NODES"
  HARNESS__REDIS__MIN_REPLICAS_ACK="$acks" HARNESS__REDIS__RESPONSE_TIMEOUT_MS=1000)

ports=() targets=() bases=()
for i in 0 1; do
  port=$(free_port)
  ports+=("$port")
  env "${store_env[@]}" HARNESS__REDIS__KEY_PREFIX="$prefix" \
    HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN=failover-token \
    HARNESS__SERVER__REPLICA_NAME="replica-$i" HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port" \
    RUST_LOG=warn "$bin" serve >>"$work/replica-$i.log" 2>&1 &
  track "$!"
  wait_ready "http://127.0.0.1:$port"
  targets+=(--target "http://127.0.0.1:$port")
  bases+=("http://127.0.0.1:$port")
done
echo "==> failover: ${duration}s at ${rate}/s judged releases, 2 harness replicas," \
  "min_replicas_ack=$acks, kill -9 of a master at ${kill_at}s; cluster on ports ${CLUSTER_PORTS[*]}"

env "${store_env[@]}" RUST_LOG=warn "$bin" soak --chaos --only supported "${targets[@]}" \
  --token failover-token --key-prefix "$prefix" --model-listen "127.0.0.1:$model_port" \
  --model-latency-ms 20 --duration "$duration" --rate "$rate" --retry-for 60 \
  --report-dir soak-reports >"$work/report.json" 2>"$work/soak.log" &
soak_pid=$!

sleep "$kill_at"
victim=$(cluster_masters | head -n 1)
victim_id=$(redis-cli -p "$victim" cluster myid)
slots=$(redis-cli -p "$victim" cluster nodes | awk '/myself/ {for (i = 9; i <= NF; i++) printf "%s ", $i}')
survivor=""
for port in "${CLUSTER_PORTS[@]}"; do [ "$port" != "$victim" ] && { survivor=$port; break; }; done

# The probe: fresh runs whose slot the victim owns, one every 100 ms, from the kill on.
python3 - "$work/gap" "$prefix" "$slots" "${bases[@]}" <<'PY' &
import json, sys, time, urllib.request
out, prefix, slots, bases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc
ranges = [tuple(int(x) for x in r.split("-")) if "-" in r else (int(r), int(r))
          for r in slots.split() if not r.startswith("[")]
owned = lambda s: any(a <= s <= b for a, b in ranges)
t0 = time.time()
n = 0
while time.time() - t0 < 120:
    n += 1
    run = f"probe-{int(t0)}-{n}"
    if not owned(crc16(run.encode()) % 16384):
        continue
    req = urllib.request.Request(
        f"{bases[n % len(bases)]}/v1/runs/{run}/release",
        data=json.dumps({"query": "probe", "stop_reason": "INFORMATION_SATURATION"}).encode(),
        headers={"Authorization": "Bearer failover-token", "Content-Type": "application/json"})
    try:
        status = urllib.request.urlopen(req, timeout=3).status
    except Exception:
        status = 0
    if status == 200:
        open(out, "w").write(f"{time.time() - t0:.2f}\n")
        break
    time.sleep(0.1)
PY
probe_pid=$!
killed_at=$(date +%s.%N)
kill -9 "$(cat "$CLUSTER_DIR/redis-$victim.pid")"
echo "==> killed master 127.0.0.1:$victim (slots $slots) with kill -9"

promoted=""
for _ in $(seq 1 300); do
  # The victim's former replica is a master now when no replica follows the victim any more
  # and the victim is flagged failed.
  if redis-cli -p "$survivor" cluster nodes 2>/dev/null | grep "^$victim_id" | grep -q "fail"; then
    if ! redis-cli -p "$survivor" cluster nodes 2>/dev/null | awk -v id="$victim_id" '$4 == id && $3 ~ /slave/' | grep -q .; then
      promoted=$(python3 -c "import time; print(f'{time.time() - $killed_at:.2f}')")
      break
    fi
  fi
  sleep 0.1
done
echo "==> replica promoted after ${promoted:-?} s; restarting the killed node (it rejoins as a replica)"
start_cluster_node "$victim"
wait_cluster_ok || true

wait "$probe_pid" || true
gap=$(cat "$work/gap" 2>/dev/null || echo "none within 120 s")
status=0
wait "$soak_pid" || status=$?
python3 - "$work/report.json" "$acks" "${promoted:-?}" "$gap" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
i = r.get("integrity", {})
lost = (i.get("stored_missing") or 0) + (i.get("stored_differs") or 0)
print(f"min_replicas_ack={sys.argv[2]}: promotion {sys.argv[3]} s after kill -9; "
      f"gap (kill -9 to the first 200 on the killed master's slots) {sys.argv[4].strip()} s")
print(f"releases {r['sent']} sent, {r['answered']} answered 200, {r['retries']} retries "
      f"(503/409/transport), throughput {r['throughput_per_s']:.1f}/s, "
      f"latency p50 {r['latency_ms']['p50']:.1f} ms p99 {r['latency_ms']['p99']:.1f} ms")
print(f"answered 200 then lost: {lost} (missing {i.get('stored_missing')}, differing "
      f"{i.get('stored_differs')}) of {i.get('runs_checked')} answers checked; "
      f"{i.get('replays_checked')} replays (differing {i.get('replays_differ')}); "
      f"locks left after one lease {i.get('locks_left')}")
for v in r["violations"][:10]:
    print("  violation:", v)
PY
tail -n 2 "$work/soak.log" >&2 || true
exit "$status"
