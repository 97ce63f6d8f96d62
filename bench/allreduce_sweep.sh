#!/usr/bin/env bash
# Side-by-side all_reduce timings on this machine, in one run: ddp's shm, mpi and
# gloo backends (bench allreduce), Open MPI's own MPI_Allreduce (mpi_allreduce_ref)
# and torch.distributed's gloo (bench/peer/torch_allreduce.py), for 2 and 4 ranks.
#
#   bench/allreduce_sweep.sh [--ranks "2 4"] [--sizes MIN:MAX] [--build DIR] [--no-torch]
#
#   --ranks LIST     world sizes (default "2 4")
#   --sizes MIN:MAX  byte range, doubling (default 4096:16777216)
#   --build DIR      build folder with bin/ddprun, bin/bench, bin/mpi_allreduce_ref
#                    (default build)
#   --no-torch       skip the torch peer
# Prints a table per world size: time_us and busbw_gbps per implementation; the raw
# JSON lines are kept in $OUT or /tmp/allreduce_sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks="2 4" sizes="4096:16777216" build=build torch=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks | --sizes | --build)
      [ $# -ge 2 ] || { echo "allreduce_sweep.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
    --ranks) ranks=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-torch) torch=0; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "allreduce_sweep.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
min=${sizes%%:*} max=${sizes##*:}
out=${OUT:-/tmp/allreduce_sweep}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe --bind-to none)
range=(--min-bytes "$min" --max-bytes "$max")
for n in $ranks; do
  f="$out/np$n.jsonl"
  : > "$f"
  for backend in shm gloo; do
    echo "allreduce_sweep: $n ranks, ddp $backend" >&2
    "$build/bin/ddprun" -n "$n" --no-prefix --quiet "$build/bin/bench" allreduce --json \
      --backend "$backend" "${range[@]}" 2>/dev/null | grep '"bytes"' >> "$f"
  done
  echo "allreduce_sweep: $n ranks, ddp mpi" >&2
  "${mpirun[@]}" -np "$n" "$build/bin/bench" allreduce --json --backend mpi "${range[@]}" \
    2>/dev/null | grep '"bytes"' >> "$f"
  echo "allreduce_sweep: $n ranks, Open MPI MPI_Allreduce" >&2
  "${mpirun[@]}" -np "$n" "$build/bin/mpi_allreduce_ref" "${range[@]}" 2>/dev/null >> "$f"
  if [ "$torch" = 1 ]; then
    echo "allreduce_sweep: $n ranks, torch gloo" >&2
    port=$((29600 + n))
    pids=()
    for ((r = 0; r < n; ++r)); do
      RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
        /usr/bin/python3 bench/peer/torch_allreduce.py "${range[@]}" >> "$f" 2>/dev/null &
      pids+=($!)
    done
    wait "${pids[@]}"
  fi
  /usr/bin/python3 - "$f" "$n" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
impls = []
for r in rows:
    if r["backend"] not in impls:
        impls.append(r["backend"])
sizes = sorted({r["bytes"] for r in rows})
get = {(r["backend"], r["bytes"]): r for r in rows}
print(f"\nall_reduce f32, {sys.argv[2]} ranks: time_us / busbw_gbps")
print(f"{'bytes':>10}  " + "  ".join(f"{i:>20}" for i in impls))
for s in sizes:
    cells = []
    for i in impls:
        r = get.get((i, s))
        cells.append(f"{r['time_us']:>9.1f} / {r['busbw_gbps']:>7.3f}" if r else f"{'-':>20}")
    print(f"{s:>10}  " + "  ".join(f"{c:>20}" for c in cells))
PY
done
