#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy, every test against a private
# redis-server (installed from Debian's packages if missing), the HTTP API tests a second
# time against a private Redis Cluster (3 masters + 3 replicas), API fuzzing from the OpenAPI
# document (schemathesis, scripts/api-fuzz.sh), the console in headless Chromium
# (scripts/console-test.sh), the alert-rule tests (promtool), and a 30 s
# soak scraped by a real Prometheus that checks every dashboard query.
# Usage: scripts/test.sh   (from anywhere; a clean clone is enough)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
# The service's allocator, jemalloc, is built from its C source: it needs make.
need_pkg make make

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT

start_redis "$work"
export HARNESS_TEST_REDIS_URL="$REDIS_URL"
echo "==> redis-server on port $REDIS_PORT"
start_redis_cluster "$work"
echo "==> Redis Cluster on ports ${CLUSTER_PORTS[*]}"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy -D warnings"
cargo clippy --all-targets --locked -- -D warnings

echo "==> cargo test"
cargo test --locked --all-targets

echo "==> the HTTP API tests again, on the Redis Cluster"
HARNESS_TEST_REDIS_CLUSTER="$CLUSTER_NODES" cargo test --locked --test api

echo "==> API fuzzing from the OpenAPI document (schemathesis)"
scripts/api-fuzz.sh

echo "==> the console in headless Chromium (scripts/console-test.sh)"
scripts/console-test.sh

echo "==> alert rules (promtool)"
scripts/check-alerts.sh

echo "==> short soak under a real Prometheus"
scripts/prometheus-check.sh 30

echo "==> all checks passed"
