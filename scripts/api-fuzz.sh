#!/usr/bin/env bash
# API fuzzing from the OpenAPI document: schemathesis (PyPI, pinned, in a private venv under
# the cache folder) generates requests for every operation of `GET /openapi.json` of the
# real binary (`serve`, debug build, no model, a private redis-server with two seeded runs,
# one of them released) and fails on any 5xx, any status code, content type, header or body
# the document does not describe, a valid request refused or an invalid one accepted, a
# route that ignores its token, and a 405 without `Allow`. A fixed seed makes a run
# reproducible. Usage: scripts/api-fuzz.sh
# (env: API_FUZZ_SEED; API_FUZZ_EXAMPLES, the most test cases per operation and phase;
# API_FUZZ_CHECKS, schemathesis's --checks)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# Pinned: the CLI's flags changed in 4.0 and the seed reproduces a run only with one version.
schemathesis_version=4.32.5
seed=${API_FUZZ_SEED:-20261201}
examples=${API_FUZZ_EXAMPLES:-200}
checks=${API_FUZZ_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance,positive_data_acceptance,negative_data_rejection,missing_required_header,ignored_auth,unsupported_method,allow_header_conformance}
venv="${XDG_CACHE_HOME:-$HOME/.cache}/release-harness/schemathesis-$schemathesis_version"
st="$venv/bin/st"

# need_venv: `python3 -m venv` that can create a venv with pip (Debian ships ensurepip
# in python3-venv, a separate package).
need_venv() {
  need_pkg python3 python3
  local probe
  probe=$(mktemp -d)
  if python3 -m venv --help >/dev/null 2>&1 && python3 -m venv "$probe/v" >/dev/null 2>&1; then
    rm -rf "$probe"
    return 0
  fi
  rm -rf "$probe"
  local sudo="" minor
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  minor=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  echo "==> installing python3-venv (for python3 -m venv)" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq python3-venv >/dev/null
  $sudo apt-get install -y -qq "python$minor-venv" >/dev/null 2>&1 || true
  python3 -m venv --help >/dev/null 2>&1 || { echo "cannot install python3-venv" >&2; return 1; }
}

if [ "$("$st" --version 2>/dev/null)" != "st, version $schemathesis_version" ]; then
  need_venv
  echo "==> installing schemathesis $schemathesis_version into $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$schemathesis_version"
fi

# A no-op when scripts/test.sh has already built it.
cargo build --locked --quiet --bin release-harness
bin=target/debug/release-harness

work=$(mktemp -d)
trap 'cleanup "$work"' EXIT
start_redis "$work"

port=$(free_port)
token="fuzz-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
base="http://127.0.0.1:$port"
export HARNESS__REDIS__URL="$REDIS_URL" HARNESS__REDIS__KEY_PREFIX=fuzz
export HARNESS__SERVER__LISTEN="127.0.0.1:$port" HARNESS__SERVER__API_TOKEN="$token"
export HARNESS__SERVER__WORKERS=2 HARNESS__MODEL__BASE_URL=""

# The run of the document's examples, recorded and released before the fuzzing (with no
# model: SEMANTIC_UNAVAILABLE, with verified sources), so that its result and audit are
# stored and the examples reach them. Every other run id the fuzzer makes up is an empty run.
run=r-order-api-timeout-success
"$bin" seed examples/runs/success-supported.json --print-body >"$work/body.json"

RUST_LOG=warn "$bin" serve >"$work/serve.log" 2>&1 & track $!
wait_ready "$base"
curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d @"$work/body.json" "$base/v1/runs/$run/release" >"$work/released.json" \
  || { echo "the seeding release failed" >&2; exit 1; }
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("    seeded run", r["run_id"], "released:", r["outcome"], r["fallback_type"], len(r["verified_sources"]), "verified sources")' "$work/released.json"

echo "==> schemathesis $schemathesis_version on $base/openapi.json (seed $seed, at most $examples examples per operation)"
start=$SECONDS
set +e
# From the work folder: schemathesis keeps a cache of past failures (.schemathesis/) in the
# current folder and replays them first; every run here starts without one. One worker:
# with two, the cases differ from run to run despite the seed (and it is no faster here).
(cd "$work" && "$st" run "$base/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks "$checks" \
  --max-examples "$examples" \
  --seed "$seed" \
  --generation-database none \
  --workers 1 \
  --request-timeout 10 \
  --no-color)
rc=$?
set -e
echo "==> schemathesis finished in $((SECONDS - start)) s with exit code $rc"
if [ "$rc" -ne 0 ]; then
  echo "--- the service's log (warnings and errors)" >&2
  tail -50 "$work/serve.log" >&2
  exit "$rc"
fi
echo "==> API fuzzing passed"
