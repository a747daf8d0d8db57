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

# pin_cores: with PIN=1, HARNESS_PIN and LOAD_PIN are command prefixes that keep the
# harness on core 0 and everything else (Redis, the fake model, the load) on the other
# cores, the way issue 11 measured latency: the harness's figures are then its own, not
# those of the load sharing its core. Without PIN both are empty. Pins the running private
# Redis (all its threads) too.
pin_cores() {
  HARNESS_PIN=()
  LOAD_PIN=()
  [ -n "${PIN:-}" ] || return 0
  local cores
  cores=$(nproc)
  [ "$cores" -ge 2 ] || { echo "PIN=1 needs two cores or more" >&2; return 1; }
  HARNESS_PIN=(taskset -c 0)
  LOAD_PIN=(taskset -c "1-$((cores - 1))")
  if [ -n "${REDIS_PIDFILE:-}" ] && [ -f "$REDIS_PIDFILE" ]; then
    taskset -apc "1-$((cores - 1))" "$(cat "$REDIS_PIDFILE")" >/dev/null
  fi
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
  stop_redis_cluster
  [ -n "${1:-}" ] && rm -rf "$1"
}

# start_redis_cluster DIR: starts a private Redis Cluster on loopback, 3 masters + 3 replicas
# (Debian's redis-server, `--cluster-enabled yes`, no persistence, cluster-node-timeout
# 1000 ms so a dead master is replaced within a few seconds) and sets CLUSTER_PORTS (six
# ports, masters first as created), CLUSTER_NODES (comma-separated redis:// URLs: the
# `redis.cluster_nodes` seeds) and CLUSTER_DIR. Stop it with stop_redis_cluster.
start_redis_cluster() {
  local dir=$1 port
  need_pkg redis-server redis-server
  CLUSTER_DIR="$dir/cluster"
  mkdir -p "$CLUSTER_DIR"
  # A node also listens on PORT + 10000 (the cluster bus), so PORT must be <= 55535.
  read -r -a CLUSTER_PORTS < <(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
ports = []
while len(ports) < 6:
    p = random.randint(20000, 45000)
    if p not in ports and free(p) and free(p + 10000):
        ports.append(p)
print(*ports)
PY
)
  for port in "${CLUSTER_PORTS[@]}"; do start_cluster_node "$port"; done
  for port in "${CLUSTER_PORTS[@]}"; do
    for _ in $(seq 1 50); do
      redis-cli -p "$port" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
  local hosts=()
  for port in "${CLUSTER_PORTS[@]}"; do hosts+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"$CLUSTER_DIR/create.log" 2>&1 \
    || { cat "$CLUSTER_DIR/create.log" >&2; echo "redis-cli --cluster create failed" >&2; return 1; }
  wait_cluster_ok || return 1
  CLUSTER_NODES=$(printf 'redis://127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")
  CLUSTER_NODES=${CLUSTER_NODES%,}
  export CLUSTER_DIR CLUSTER_NODES
}

# start_cluster_node PORT: (re)starts one cluster node of CLUSTER_DIR; its nodes.conf there
# keeps its identity, so a restarted node rejoins (as a replica if it was failed over). Each
# node has its own RDB file name: a replica's full sync goes through that file, and replicas
# syncing at once into one shared dump.rdb would load each other's data.
start_cluster_node() {
  local port=$1
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --dbfilename "dump-$port.rdb" \
    --cluster-enabled yes --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 1000 \
    --pidfile "$CLUSTER_DIR/redis-$port.pid" --dir "$CLUSTER_DIR" \
    --logfile "$CLUSTER_DIR/redis-$port.log" >/dev/null
}

# wait_cluster_ok: waits up to 20 s until every node of CLUSTER_PORTS that answers reports
# cluster_state:ok and all 16384 slots assigned.
wait_cluster_ok() {
  local port ok
  for _ in $(seq 1 200); do
    ok=1
    for port in "${CLUSTER_PORTS[@]}"; do
      redis-cli -p "$port" ping >/dev/null 2>&1 || continue
      redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || ok=0
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  echo "the Redis Cluster did not reach cluster_state:ok" >&2
  return 1
}

# cluster_masters: prints the ports of the cluster's current masters.
cluster_masters() {
  redis-cli -p "${CLUSTER_PORTS[0]}" cluster nodes 2>/dev/null \
    | awk '$3 ~ /master/ && $3 !~ /fail/ {split($2, a, "[:@]"); print a[2]}' | sort -n
}

stop_redis_cluster() {
  local port pid pids=()
  for port in "${CLUSTER_PORTS[@]:-}"; do
    [ -n "$port" ] && [ -f "$CLUSTER_DIR/redis-$port.pid" ] || continue
    pid=$(cat "$CLUSTER_DIR/redis-$port.pid")
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]:-}"; do
    [ -n "$pid" ] || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  CLUSTER_PORTS=()
}
