#!/usr/bin/env bash
# A short soak (CI) with a real Prometheus scraping the harness under load: the soak must
# pass its invariants, every alert rule must load healthy, and every Grafana panel query
# must return data without an error. Installs Debian's prometheus and redis-server if missing.
#   scripts/prometheus-check.sh [SOAK_SECONDS=40]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
soak_seconds=${1:-40}

need_pkg prometheus prometheus
work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
cargo build --locked --quiet --bin release-harness

harness_port=$(free_port)
prom_port=$(free_port)
cp config/prometheus/alerts.yml "$work/alerts.yml"
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $work/alerts.yml
scrape_configs:
  - job_name: release-harness
    static_configs:
      - targets: ["127.0.0.1:$harness_port"]
YAML

echo "==> short soak (${soak_seconds}s) with the harness on port $harness_port"
HARNESS__REDIS__URL="$REDIS_URL" RUST_LOG=warn target/debug/release-harness soak \
  --duration "$soak_seconds" --rate 15 --listen "127.0.0.1:$harness_port" \
  --report-dir "$work/reports" >"$work/soak.json" 2>"$work/soak.log" &
soak_pid=$!
track $soak_pid

prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
track $!
prom="http://127.0.0.1:$prom_port"
for _ in $(seq 1 100); do curl -sf "$prom/-/ready" >/dev/null && break; sleep 0.2; done
curl -sf "$prom/-/ready" >/dev/null || { cat "$work/prometheus.log"; echo "prometheus did not start"; exit 1; }

# Let Prometheus collect a good stretch of the soak before asking it anything.
sleep $(( soak_seconds * 3 / 4 ))

echo "==> every dashboard panel query returns data"
python3 - "$prom" grafana/dashboards/release-harness.json <<'PY'
import json, sys, urllib.parse, urllib.request
prom, dashboard = sys.argv[1], sys.argv[2]
panels = []
def walk(items):
    for p in items:
        panels.append(p)
        walk(p.get("panels", []))
walk(json.load(open(dashboard))["panels"])
failed = 0
checked = 0
for panel in panels:
    for target in panel.get("targets", []):
        expr = target.get("expr")
        if not expr:
            continue
        expr = expr.replace("$__rate_interval", "1m")
        url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            answer = json.load(urllib.request.urlopen(url, timeout=10))
        except Exception as e:
            answer = {"status": "error", "error": str(e)}
        checked += 1
        result = answer.get("data", {}).get("result", [])
        values = [r["value"][1] for r in result if "value" in r]
        ok = answer.get("status") == "success" and values and any(v not in ("NaN", "+Inf", "-Inf") for v in values)
        print(("  ok    " if ok else "  FAIL  ") + panel.get("title", "?") + ": " + expr[:90])
        if not ok:
            print("        ->", json.dumps(answer)[:300])
            failed += 1
print(f"  {checked} queries, {failed} failed")
sys.exit(1 if failed or not checked else 0)
PY

echo "==> every alert rule loads healthy"
curl -sf "$prom/api/v1/rules" | python3 -c '
import json, sys
groups = json.load(sys.stdin)["data"]["groups"]
rules = [r for g in groups for r in g["rules"]]
bad = [r["name"] for r in rules if r.get("health") != "ok"]
print(f"  {len(rules)} rules, unhealthy: {bad}")
sys.exit(1 if bad or not rules else 0)'

echo "==> the soak's invariants"
if wait "$soak_pid"; then
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("  %d sent, %d answered, %.1f/s, p50 %.1f ms, p99 %.1f ms, overhead p50 %.2f ms, RSS %d -> %d kB" % (
  r["sent"], r["answered"], r["throughput_per_s"], r["latency_ms"]["p50"], r["latency_ms"]["p99"],
  r["overhead_ms"]["p50"], r["rss_start_kb"], r["rss_end_kb"]))
print("  outcomes:", r["outcomes"])' "$work/soak.json"
else
  cat "$work/soak.log" | tail -20
  cat "$work/soak.json" | tail -40
  echo "the soak broke an invariant"
  exit 1
fi
