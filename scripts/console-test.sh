#!/usr/bin/env bash
# The console's end-to-end browser test: headless Chromium (Debian's `chromium`), driven by
# the npm registry's `playwright-core` (pinned, installed into the cache folder), against the
# real binary (`serve`, debug build) on a private redis-server with the project's fake model
# (`fake-model`). scripts/console-test.mjs releases runs with every outcome, opens /console,
# types the token, finds and filters the runs, reads a blocked run's rule and the judge's
# reason, cancels a run pending on a hanging model, and proves that hostile payloads in the
# query, the Draft, a tool record and the judge's reason never run. Screenshots of the list
# and of a run page go to OUT (default target/console-test).
# Usage: scripts/console-test.sh   (OUT=dir to keep the screenshots elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

playwright_version=1.65.2
pw_dir="${XDG_CACHE_HOME:-$HOME/.cache}/release-harness/playwright-core-$playwright_version"
out=$(realpath -m "${OUT:-target/console-test}")

need_pkg chromium chromium
need_pkg node nodejs
need_pkg npm npm
if [ ! -f "$pw_dir/node_modules/playwright-core/package.json" ]; then
  echo "==> installing playwright-core $playwright_version into $pw_dir"
  mkdir -p "$pw_dir"
  (cd "$pw_dir" && npm install --no-audit --no-fund --silent "playwright-core@$playwright_version")
fi

# A no-op when scripts/test.sh has already built it.
cargo build --locked --quiet --bin release-harness
bin=$(realpath target/debug/release-harness)

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"
mkdir -p "$out"

model_port=$(free_port)
"$bin" fake-model --listen "127.0.0.1:$model_port" >"$work/model.log" 2>&1 & track $!

port=$(free_port)
token="console-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
base="http://127.0.0.1:$port"
export HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX=console
export HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN="$token"
export HARNESS__SERVER__WORKERS=2 HARNESS__MODEL__BASE_URL="http://127.0.0.1:$model_port"
export HARNESS__SERVER__REPLICA_NAME=console-test
RUST_LOG=warn "$bin" serve >"$work/serve.log" 2>&1 & track $!
wait_ready "$base"

echo "==> the console test (Chromium $(chromium --version 2>/dev/null | awk '{print $2}'), playwright-core $playwright_version), screenshots in $out"
set +e
BASE="$base" TOKEN="$token" OUT="$out" BIN="$bin" EXAMPLES="$(realpath examples/runs)" \
  PLAYWRIGHT_DIR="$pw_dir" USER_DATA_DIR="$work/chromium-profile" CHROMIUM=/usr/bin/chromium \
  node scripts/console-test.mjs
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  echo "--- the service's log" >&2
  tail -30 "$work/serve.log" >&2
fi
# The token was typed into the page and sent in headers only: it is in no log.
if grep -q "$token" "$work/serve.log"; then
  echo "  FAIL the API token appears in the service's log" >&2
  rc=1
fi
exit "$rc"
