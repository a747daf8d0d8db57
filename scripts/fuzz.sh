#!/usr/bin/env bash
# Fuzzes every parser of untrusted input (the targets in fuzz/fuzz_targets/, see
# src/tools/fuzzing.rs) for SECONDS each, one after the other, and prints per target the inputs
# run and whether a crash (panic, allocation over 256 MB, RSS over 512 MB, input over 10 s)
# was found. Not part of CI: CI replays the committed corpus (tests/fuzz_corpus.rs).
#   scripts/fuzz.sh SECONDS [--merge] [TARGET...]
# Needs the nightly toolchain (rustup toolchain install nightly); installs cargo-fuzz.
# New inputs go to fuzz/target/corpus/TARGET (not committed); --merge then adds those that
# bring new coverage to fuzz/corpus/TARGET (then: cargo +nightly fuzz cmin TARGET -- -use_counters=0).
# A crash leaves its input in fuzz/artifacts/TARGET/.
# Exits non-zero if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/fuzz.sh SECONDS [--merge] [TARGET...]" >&2; exit 2; }
[ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ] || usage
seconds=$1
shift
merge=0
targets=()
all=1
for arg in "$@"; do
  case $arg in
    --merge) merge=1 ;;
    -*) usage ;;
    *) targets+=("$arg"); all=0 ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for file in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$file" .rs)"); done
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "error: the nightly toolchain is missing (cargo fuzz needs it):" >&2
  echo "       rustup toolchain install nightly" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked
fi

echo "==> building ${#targets[@]} fuzz targets (nightly, AddressSanitizer)"
if [ "$all" -eq 1 ]; then
  cargo +nightly fuzz build
else
  for target in "${targets[@]}"; do cargo +nightly fuzz build "$target"; done
fi

logs=fuzz/target/logs
mkdir -p "$logs"
summary=()
crashed=0
for target in "${targets[@]}"; do
  work=fuzz/target/corpus/$target
  mkdir -p "$work"
  echo "==> $target for ${seconds}s (log: $logs/$target.log)"
  status=0
  # The first corpus directory receives new inputs; the committed one is only read.
  cargo +nightly fuzz run "$target" "$work" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=512 -malloc_limit_mb=256 -timeout=10 \
    -print_final_stats=1 >"$logs/$target.log" 2>&1 || status=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$target.log" | grep -o '[0-9]*$' | tail -1 || true)
  if [ "$status" -eq 0 ]; then
    result="no crash"
    if [ "$merge" -eq 1 ]; then
      before=$(find "fuzz/corpus/$target" -type f | wc -l)
      cargo +nightly fuzz run "$target" "fuzz/corpus/$target" "$work" -- -merge=1 \
        >"$logs/$target.merge.log" 2>&1
      after=$(find "fuzz/corpus/$target" -type f | wc -l)
      result="$result, merged $((after - before)) new inputs"
    fi
  else
    crashed=1
    artifact=$(grep -o 'Test unit written to [^ ]*' "$logs/$target.log" | tail -1 | sed 's/Test unit written to //' || true)
    reason=$(grep -m1 -oE 'ERROR: libFuzzer: [a-z-]+|panicked at [^:]*:[0-9]+' "$logs/$target.log" || true)
    result="CRASH (${reason:-exit $status}) ${artifact:-see the log}"
    tail -n 30 "$logs/$target.log" >&2
  fi
  summary+=("$(printf '%-18s %12s execs  %s' "$target" "${execs:-?}" "$result")")
done

echo "==> summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit "$crashed"
