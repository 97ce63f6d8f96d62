#!/usr/bin/env bash
# train_ddprun.sh DDPRUN TRAIN NPROC MIN_ACC [TRAIN FLAGS...]: `ddprun -n NPROC train`
# on the synthetic set trains with DistributedDataParallel; only rank 0 reports,
# the final test accuracy (all ranks' shards) reaches MIN_ACC and the metrics say
# the world size, mode ddp and a phase split with a communication time.
set -uo pipefail
ddprun=$1 train=$2 nproc=$3 min_acc=$4
shift 4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# --standalone: a free port, so parallel ctest runs do not collide on 29500.
output=$("$ddprun" --standalone -n "$nproc" "$train" --data synthetic --synthetic-size 3000 --epochs 3 \
         --metrics "$dir/m.jsonl" "$@" 2>&1)
status=$?
printf '%s\n' "$output"
fail() { echo "train_ddprun.sh: $*" >&2; exit 1; }
[ "$status" -eq 0 ] || fail "exit code $status"
grep -q '^\[rank [1-9]' <<<"$output" && fail "a rank other than 0 printed"
acc=$(sed -nE 's/^\[rank 0\] summary: .*final test_acc ([0-9.]+).*/\1/p' <<<"$output")
[ -n "$acc" ] || fail "no summary from rank 0"
awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' || fail "test_acc $acc < $min_acc"
grep -q "\"world_size\": $nproc" "$dir/m.jsonl" || fail "metrics lack world_size $nproc"
grep -q '"mode": "ddp"' "$dir/m.jsonl" || fail "metrics lack mode ddp"
grep -Eq '"comm_ms": 0\.0*[1-9]|"comm_ms": [1-9]' "$dir/m.jsonl" || fail "metrics show no communication time"
echo "train_ddprun.sh: ok (test_acc $acc with $nproc ranks)"
