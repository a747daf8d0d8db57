#!/usr/bin/env bash
# Redis's own clock (SLOWLOG, every call logged) on the begin and records scripts over the
# agent's worst data (issue 32): a calls list of 40 ids of 10 MB, 1,000 ids of 10 kB, 950
# multibyte ids of 256 bytes, 1,000 real records, and 16 cited records of 256 kB. Prints
# the microseconds of one begin call (and of one records call where the harness reads on)
# per case. Not run by CI (it writes about 420 MB into a private Redis).
#   scripts/redis-script-times.sh [SCRIPTS_DIR]   (default src/store/redis/scripts)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
dir=${1:-src/store/redis/scripts}
work=$(mktemp -d)
trap 'stop_redis; rm -rf "$work"' EXIT
start_redis "$work"
R=(redis-cli -p "$REDIS_PORT")
"${R[@]}" config set slowlog-log-slower-than 0 >/dev/null
cat "$dir/record_reader.lua" "$dir/begin.lua" >"$work/begin.lua"
cat "$dir/record_reader.lua" "$dir/records.lua" >"$work/records.lua"
F=(run_id tool_call_id tool_name lifecycle evidence_status agent_result finished_at)

for _ in $(seq 1 40); do head -c 10000000 /dev/zero | tr '\0' x | "${R[@]}" -x rpush 'A:run:{a}:calls' >/dev/null; done
python3 -c "
for i in range(1000): print('RPUSH \"B:run:{b}:calls\" ' + str(i).rjust(5,'0') + 'x'*9995)
for i in range(950): print('RPUSH \"C:run:{c}:calls\" ' + str(i).rjust(4,'0') + 'é'*126)
for i in range(1000):
    print('HSET \"E:run:{e}:call:c-%d\" run_id e tool_call_id c-%d tool_name log_search lifecycle READY agent_result %s' % (i, i, 'y'*1100))
    print('RPUSH \"E:run:{e}:calls\" c-%d' % i)
" | "${R[@]}" >/dev/null
for i in $(seq 0 15); do
  head -c 262000 /dev/zero | tr '\0' y | "${R[@]}" -x hset "G:run:{g}:call:g-$i" agent_result >/dev/null
done

last() { "${R[@]}" slowlog get 1 | sed -n 3p; }
# begin RUN [cited ids...]: the begin script as the harness sends it with the defaults.
begin() {
  local s=$1; shift
  local keys=("$S:release:{$s}" "$S:release:{$s}:lock" "$S:run:{$s}:cancelled" "$S:run:{$s}:calls")
  for id in "$@"; do keys+=("$S:run:{$s}:call:$id"); done
  "${R[@]}" slowlog reset >/dev/null
  "${R[@]}" --eval "$work/begin.lua" "${keys[@]}" , "tok$RANDOM" 5000 1000 256 262144 262144 \
    4194304 32 131072 "$S:run:{$s}:call:" "${F[@]}" >/dev/null
  last
  "${R[@]}" del "$S:release:{$s}:lock" >/dev/null
}
records() {
  local s=$1; shift
  local keys=()
  for id in "$@"; do keys+=("$S:run:{$s}:call:$id"); done
  "${R[@]}" slowlog reset >/dev/null
  "${R[@]}" --eval "$work/records.lua" "${keys[@]}" , 262144 4194304 32 131072 \
    "$S:run:{$s}:call:" "${F[@]}" >/dev/null
  last
}
printf '%-44s %s\n' case "microseconds (Redis's SLOWLOG)"
S=A; printf '%-44s %s\n' "40 listed ids of 10 MB: begin" "$(begin a)"
S=B; printf '%-44s %s\n' "1,000 listed ids of 10 kB: begin" "$(begin b)"
S=C; printf '%-44s %s\n' "950 listed multibyte ids of 256 B: begin" "$(begin c)"
ids=(); for i in $(seq 0 31); do ids+=("0$(printf %03d $i)$(python3 -c "print('é'*126)")"); done
printf '%-44s %s\n' "  then one records call (32 ids)" "$(records c "${ids[@]}")"
S=E; printf '%-44s %s\n' "1,000 listed records of 1 kB: begin" "$(begin e)"
ids=(); for i in $(seq 0 31); do ids+=("c-$i"); done
printf '%-44s %s\n' "  then one records call (32 records)" "$(records e "${ids[@]}")"
S=G; g=(); for i in $(seq 0 15); do g+=("g-$i"); done
printf '%-44s %s\n' "16 cited records of 256 kB: begin" "$(begin g "${g[@]}")"
printf '%-44s %s\n' "  then one records call" "$(records g "${g[@]:1}")"
