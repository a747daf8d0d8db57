#!/usr/bin/env bash
# A long soak of an optimised build on a private Redis (not part of CI):
#   scripts/soak.sh [DURATION_SECONDS=600] [RATE_PER_SECOND=20]
# Writes soak-reports/<time>/report.json and plot.svg; exits non-zero if an invariant broke.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
duration=${1:-600}
rate=${2:-20}

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
cargo build --release --locked --quiet --bin release-harness
echo "==> soak: ${duration}s at ${rate}/s on $(nproc) cores, Redis on port $REDIS_PORT"
HARNESS__REDIS__URL="$REDIS_URL" RUST_LOG=warn target/release/release-harness soak \
  --duration "$duration" --rate "$rate" --report-dir soak-reports
