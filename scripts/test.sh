#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy, every test against a private
# redis-server (installed from Debian's packages if missing), and the alert-rule tests.
# Usage: scripts/test.sh   (from anywhere; a clean clone is enough)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

work=$(mktemp -d)
trap 'stop_redis; rm -rf "$work"' EXIT

start_redis "$work"
export HARNESS_TEST_REDIS_URL="$REDIS_URL"
echo "==> redis-server on port $REDIS_PORT"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy -D warnings"
cargo clippy --all-targets --locked -- -D warnings

echo "==> cargo test"
cargo test --locked --all-targets

if [ -x scripts/check-alerts.sh ]; then
  echo "==> alert rules"
  scripts/check-alerts.sh
fi
echo "==> all checks passed"
