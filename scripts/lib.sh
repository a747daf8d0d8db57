# Shared helpers for the scripts: install Debian packages when missing, start a private
# redis-server. Source it; it defines functions only.

# need_pkg COMMAND PACKAGE: installs PACKAGE from Debian's archive if COMMAND is missing.
need_pkg() {
  local cmd=$1 pkg=$2 sudo=""
  command -v "$cmd" >/dev/null 2>&1 && return 0
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "==> installing $pkg (for $cmd)" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq "$pkg" >/dev/null 2>&1 \
    || { $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq "$pkg" >/dev/null; }
  command -v "$cmd" >/dev/null 2>&1 || { echo "cannot install $pkg" >&2; return 1; }
}

# release_bin: sets BIN to the optimised binary, building it, unless BIN names another build
# already (e.g. an older commit's, for a before/after comparison).
release_bin() {
  if [ -z "${BIN:-}" ]; then
    cargo build --release --locked --quiet --bin release-harness
    BIN=target/release/release-harness
  fi
}

# free_port: prints a TCP port that is free on 127.0.0.1 right now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# start_redis DIR: starts a private redis-server (loopback, no persistence) and sets
# REDIS_PORT, REDIS_PIDFILE and REDIS_URL. Stop it with stop_redis.
start_redis() {
  local dir=$1
  need_pkg redis-server redis-server
  REDIS_PORT=$(free_port)
  REDIS_PIDFILE="$dir/redis-$REDIS_PORT.pid"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --pidfile "$REDIS_PIDFILE" --dir "$dir" --logfile "$dir/redis-$REDIS_PORT.log" >/dev/null
  for _ in $(seq 1 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "redis-server did not start" >&2; return 1; }
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  export REDIS_PORT REDIS_PIDFILE REDIS_URL
}

stop_redis() {
  if [ -n "${REDIS_PIDFILE:-}" ] && [ -f "$REDIS_PIDFILE" ]; then
    local pid
    pid=$(cat "$REDIS_PIDFILE")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
}

# wait_ready BASE_URL: waits up to 10 s for a harness at BASE_URL to answer /readyz 200.
wait_ready() {
  for _ in $(seq 1 100); do
    curl -sf "$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "no ready harness at $1" >&2
  return 1
}

# Background processes of a script, stopped (with its Redis and work folder) by cleanup.
bg_pids=()
track() { bg_pids+=("$1"); }

# cleanup DIR: stops tracked processes and Redis, removes DIR. Use in `trap ... EXIT`.
cleanup() {
  for p in "${bg_pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  stop_redis
  [ -n "${1:-}" ] && rm -rf "$1"
}
