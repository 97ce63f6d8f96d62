#!/usr/bin/env bash
# The environment contract for -n 1..4, OMP_NUM_THREADS, --backend, finding
# PROGRAM next to ddprun, whole lines under concurrent output, --log-dir/--quiet.
# usage: ddprun_env.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
cores=$(nproc)
value() { sed -n "s/^\[rank $2\] $3=//p" "$1"; }

for n in 1 2 3 4; do
  out="$WORK/env$n.log"
  "$DDPRUN" --standalone -n "$n" "$PROBE" --marker "$MARKER" >"$out" 2>&1 || fail "-n $n exited $?"
  threads=$((cores / n)); [ "$threads" -lt 1 ] && threads=1
  run_id=$(value "$out" 0 DDPRUN_RUN_ID) port=$(value "$out" 0 MASTER_PORT)
  secret=$(value "$out" 0 DDP_STORE_SECRET)
  [ -n "$run_id" ] && [ "$run_id" != "<unset>" ] || fail "-n $n: no DDPRUN_RUN_ID"
  [ "${#secret}" -ge 16 ] || fail "-n $n: DDP_STORE_SECRET '$secret' is not a random secret"
  for r in $(seq 0 $((n - 1))); do
    for kv in "RANK=$r" "LOCAL_RANK=$r" "WORLD_SIZE=$n" "LOCAL_WORLD_SIZE=$n" "GROUP_RANK=0" \
              "MASTER_ADDR=127.0.0.1" "MASTER_PORT=$port" "DDPRUN_RESTART_COUNT=0" \
              "DDPRUN_RUN_ID=$run_id" "DDPRUN_STORE=agent" "DDP_STORE_SECRET=$secret" \
              "OMP_NUM_THREADS=$threads" "OPENBLAS_NUM_THREADS=$threads" \
              "TORCHELASTIC_RESTART_COUNT=0" "TORCHELASTIC_MAX_RESTARTS=0" "TORCHELASTIC_RUN_ID=$run_id" \
              "TORCHELASTIC_USE_AGENT_STORE=False" "ROLE_NAME=default" "ROLE_RANK=$r" \
              "ROLE_WORLD_SIZE=$n" "GROUP_WORLD_SIZE=1"; do
      grep -qxF "[rank $r] $kv" "$out" || fail "-n $n: rank $r lacks $kv"
    done
    # ddprun's own store: a loopback port other than MASTER_PORT (Note [two stores]).
    store=$(value "$out" "$r" DDPRUN_STORE_ADDR)
    [[ "$store" =~ ^127\.0\.0\.1:[0-9]+$ ]] && [ "${store#*:}" != "$port" ] ||
      fail "-n $n: rank $r: DDPRUN_STORE_ADDR '$store' is not a loopback port other than MASTER_PORT $port"
  done
  [ "$(grep -c '\] RANK=' "$out")" -eq "$n" ] || fail "-n $n: wrong number of ranks"
done

# The user's thread count wins; --backend sets DDP_BACKEND; a fixed --master-port is used.
port=$(free_port)
OMP_NUM_THREADS=7 "$DDPRUN" -n 2 --master-port "$port" --backend gloo "$PROBE" >"$WORK/user.log" 2>&1 ||
  fail "OMP_NUM_THREADS=7 run exited $?"
for kv in OMP_NUM_THREADS=7 DDP_BACKEND=gloo "MASTER_PORT=$port"; do
  [ "$(grep -cxF "$kv" <(sed 's/^\[rank [0-9]*\] //' "$WORK/user.log"))" -eq 2 ] || fail "no $kv on both ranks"
done

# PROGRAM next to ddprun, from another directory, by name; --no-prefix.
(cd / && "$DDPRUN" --standalone --no-prefix "$(basename "$PROBE")" --marker "$MARKER") >"$WORK/name.log" 2>&1 ||
  fail "rank_probe by name exited $?"
grep -qx "RANK=0" "$WORK/name.log" || fail "--no-prefix: no bare RANK=0 line"

# Four ranks writing lines in pieces: every console line is one whole line.
"$DDPRUN" --standalone -n 4 "$PROBE" --lines 100 >"$WORK/lines.log" 2>&1 || fail "--lines exited $?"
[ "$(grep -c '^\[rank [0-3]\] line ' "$WORK/lines.log")" -eq 400 ] || fail "expected 400 line records"
grep '^\[rank [0-3]\] line ' "$WORK/lines.log" | grep -Evq '^\[rank ([0-3])\] line \1 [0-9]+ ([a-d])\3{199}$' &&
  fail "a line was cut or mixed: $(grep '^\[rank [0-3]\] line ' "$WORK/lines.log" |
       grep -Ev '^\[rank ([0-3])\] line \1 [0-9]+ ([a-d])\3{199}$' | head -2)"

# The real bootstrap through ddprun's store: init_process_group + all_reduce.
"$DDPRUN" --standalone -n 4 "$PROBE" --allreduce >"$WORK/allreduce.log" 2>&1 || fail "--allreduce exited $?"
[ "$(grep -c '^\[rank [0-3]\] allreduce=10 backend=' "$WORK/allreduce.log")" -eq 4 ] ||
  fail "all_reduce over 4 ranks did not give 10 everywhere"

# --log-dir with --quiet: rank 0 on the console, every rank in its files.
"$DDPRUN" --standalone -n 3 --log-dir "$WORK/logs" --quiet "$PROBE" --stderr-lines 1 >"$WORK/quiet.log" 2>&1 ||
  fail "--quiet exited $?"
grep -q '^\[rank 0\] RANK=0$' "$WORK/quiet.log" || fail "--quiet: rank 0 missing on the console"
grep -q '^\[rank [12]\]' "$WORK/quiet.log" && fail "--quiet: ranks 1, 2 on the console"
for r in 0 1 2; do
  grep -qx "RANK=$r" "$WORK/logs/rank_$r.out" || fail "--log-dir: rank_$r.out lacks RANK=$r"
  grep -qx "err line 1" "$WORK/logs/rank_$r.err" || fail "--log-dir: rank_$r.err lacks its stderr"
done
echo "ddprun_env: ok"
