#!/usr/bin/env bash
# The main job, end to end, on a fresh machine:
#   1. `check` on every example run with no model: every release fails closed;
#   2. `check` with a model (the built-in fake OpenAI-compatible judge): SUCCESS, a repair,
#      and an UNSUPPORTED verdict;
#   3. `serve` on a private Redis: a release, a replay, the audit, a cancel mid-call, /metrics.
# Installs redis-server from Debian's packages if missing. Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
# The service's allocator, jemalloc, is built from its C source: it needs make.
need_pkg make make

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT

echo "==> building release-harness"
cargo build --locked --quiet --bin release-harness
bin=target/debug/release-harness

outcome() { # FILE.json -> "OUTCOME FALLBACK_TYPE"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["outcome"], r["fallback_type"] or "")' "$1"
}

echo
echo "==> 1. check, no model configured (model.base_url is empty): fail closed"
printf '%-48s %-5s %s\n' "bundle" "exit" "outcome"
for bundle in examples/runs/*.json; do
  set +e
  "$bin" check "$bundle" >"$work/out.json" 2>"$work/err.txt"
  code=$?
  set -e
  if [ "$code" -eq 2 ]; then
    printf '%-48s %-5s %s\n' "$(basename "$bundle")" "$code" "bad bundle: $(tail -1 "$work/err.txt" | cut -c1-60)"
  else
    printf '%-48s %-5s %s\n' "$(basename "$bundle")" "$code" "$(outcome "$work/out.json")"
  fi
done

echo
echo "==> 2. check with a model: the built-in fake judge over real HTTP"
"$bin" fake-model --listen 127.0.0.1:0 --verdict SUPPORTED >"$work/judge.url" & track $!
"$bin" fake-model --listen 127.0.0.1:0 --verdict UNSUPPORTED >"$work/skeptic.url" & track $!
for f in judge skeptic; do for _ in $(seq 1 100); do [ -s "$work/$f.url" ] && break; sleep 0.05; done; done
judge=$(cat "$work/judge.url"); skeptic=$(cat "$work/skeptic.url")
for case in "success-supported.json:$judge" "repairable-wrong-call-id.json:$judge" "semantic-unsupported-candidate.json:$skeptic"; do
  bundle=${case%%:*}; model=${case#*:}
  set +e
  HARNESS__MODEL__BASE_URL="$model" "$bin" check "examples/runs/$bundle" >"$work/out.json" 2>"$work/err.txt"
  code=$?
  set -e
  printf '%-48s %-5s %s\n' "$bundle" "$code" "$(outcome "$work/out.json")"
done
echo
echo "--- what check printed on stderr for repairable-wrong-call-id.json:"
HARNESS__MODEL__BASE_URL="$judge" "$bin" check examples/runs/repairable-wrong-call-id.json 2>&1 >/dev/null | sed 's/^/    /' || true

echo
echo "==> 3. the service on a private Redis"
start_redis "$work"
port=$(free_port)
token=demo-token
export HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX=demo HARNESS__SERVER__API_TOKEN=$token
export HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__MODEL__BASE_URL="$judge"
export HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS=3000 HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS=6000
RUST_LOG=warn "$bin" serve & track $!
base="http://127.0.0.1:$port"
wait_ready "$base"
echo "    serving on $base, Redis on port $REDIS_PORT, model $judge"
auth=(-H "Authorization: Bearer $token" -H "Content-Type: application/json")

"$bin" seed examples/runs/success-supported.json --print-body >"$work/body.json"
run=r-order-api-timeout-success
echo
echo "--- POST /v1/runs/$run/release"
curl -s "${auth[@]}" -X POST "$base/v1/runs/$run/release" -d @"$work/body.json" | python3 -m json.tool >"$work/released.json"
head -12 "$work/released.json"
echo "    ... ($(wc -l <"$work/released.json") lines: the report without tool call ids, verified_sources, ...)"
echo "--- the same release again: the stored result, no new model call"
curl -s "${auth[@]}" -X POST "$base/v1/runs/$run/release" -d @"$work/body.json" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   ", r["outcome"])'
echo "--- GET /v1/runs/$run/audit (operators' view)"
curl -s "${auth[@]}" "$base/v1/runs/$run/audit" | python3 -c '
import json,sys
a=json.load(sys.stdin)
print("    path:", a["path"], "| verdict:", a["verdict"]["verdict"], "-", a["verdict"]["reason"])
for m in a["model_attempts"]:
    print("    model", m["role"], "attempt", m["attempt"], m["outcome"], "%.1f ms" % m["latency_ms"], m["request_bytes"], "bytes")
print("    timings: total %.2f ms, model %.2f ms, harness %.2f ms" % (a["timings"]["total_ms"], a["timings"]["model_wait_ms"], a["timings"]["overhead_ms"]))'

echo
echo "--- cancel during a pending model call"
cancel_run=r-order-api-timeout-cancel
python3 - "$work/body.json" "$work/hang.json" <<'PY'
import json, sys
body = json.load(open(sys.argv[1]))
body["query"] += " [judge:hang]"
json.dump(body, open(sys.argv[2], "w"))
PY
sed "s/r-order-api-timeout-success/$cancel_run/g" examples/runs/success-supported.json >"$work/cancel-bundle.json"
"$bin" seed "$work/cancel-bundle.json"
curl -s "${auth[@]}" -X POST "$base/v1/runs/$cancel_run/release" -d @"$work/hang.json" >"$work/cancelled.json" & curl_pid=$!
sleep 0.5
echo "    POST /v1/runs/$cancel_run/cancel -> $(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -X POST "$base/v1/runs/$cancel_run/cancel")"
wait "$curl_pid"
echo "    the pending release answered: $(outcome "$work/cancelled.json")"

echo
echo "--- GET /metrics (excerpt)"
curl -s "$base/metrics" | grep -E '^harness_(releases_total|model_calls_total\{role="semantic",result="(ok|cancelled)"|runs_in_flight|cancellations_total\{source="http")' | grep -v ' 0$' | sed 's/^/    /'
echo
echo "==> demo done. Next: scripts/test.sh (the test suite), scripts/soak.sh (a long soak)."
