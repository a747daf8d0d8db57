#!/usr/bin/env bash
# Validates the Prometheus rules and the Grafana dashboard with the real promtool:
#   1. promtool check rules   config/prometheus/alerts.yml
#   2. promtool check config  config/prometheus/prometheus.example.yml
#   3. the dashboard JSON parses, and every panel's PromQL expr (with $__rate_interval
#      replaced by 1m) passes promtool check rules as a recording rule
#   4. promtool test rules    config/prometheus/alerts.test.yml (takes about a minute:
#      one scenario replays three days of samples through the 1d and 3d windows)
# Installs Debian's `prometheus` package (which ships promtool) when promtool is missing.
# Works from any directory; exits non-zero on the first failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

RULES=config/prometheus/alerts.yml
TESTS=config/prometheus/alerts.test.yml
PROM_CONFIG=config/prometheus/prometheus.example.yml
DASHBOARD=grafana/dashboards/release-harness.json

install_promtool() {
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "promtool is missing and we are not root (no sudo): install Debian's prometheus package" >&2
            return 1
        fi
        sudo=(sudo)
    fi
    echo "promtool not found: installing Debian's prometheus package" >&2
    # Try the existing package lists first; refresh them only if that fails.
    if ! ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends prometheus; then
        ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update
        ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends prometheus
    fi
}

if ! command -v promtool >/dev/null 2>&1; then
    install_promtool
fi
promtool --version | head -n 1

echo "== promtool check rules $RULES"
promtool check rules "$RULES"

echo "== promtool check config $PROM_CONFIG"
promtool check config "$PROM_CONFIG"

echo "== dashboard $DASHBOARD"
if command -v python3 >/dev/null 2>&1; then
    python3 -m json.tool "$DASHBOARD" >/dev/null
    echo "  SUCCESS: valid JSON"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # One recording rule per panel target; JSON is valid YAML for promtool.
    python3 - "$DASHBOARD" "$tmp/dashboard-exprs.yml" <<'PY'
import json, sys
dashboard = json.load(open(sys.argv[1]))
rules = []
for panel in dashboard["panels"]:
    for target in panel.get("targets", []):
        expr = target["expr"].replace("$__rate_interval", "1m")
        if "$" in expr:
            sys.exit(f"panel {panel['title']!r}: Grafana-only syntax left in expr: {expr}")
        rules.append({"record": f"dashboard:panel{panel['id']}:{target['refId']}", "expr": expr})
if not rules:
    sys.exit("no panel exprs found")
json.dump({"groups": [{"name": "dashboard-exprs", "rules": rules}]}, open(sys.argv[2], "w"))
print(f"  {len(rules)} panel exprs extracted")
PY
    promtool check rules "$tmp/dashboard-exprs.yml"
else
    echo "  SKIPPED: python3 not found, dashboard JSON and exprs not checked" >&2
fi

echo "== promtool test rules $TESTS"
promtool test rules "$TESTS"

echo "All checks passed."
