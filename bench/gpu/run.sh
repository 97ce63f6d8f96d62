#!/usr/bin/env bash
# The one command a GPU machine runs: the gpu tests, training on CUDA against the
# CPU, DDP and DataParallel on one GPU, the device benchmarks and PyTorch side by
# side; a Markdown table last. See --help and docs/building.md ("Checking the GPU
# path").
set -uo pipefail # no -e: a failed step is recorded and the next one runs

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="${repo_root}/bench/gpu"

usage() {
  cat <<'EOF'
usage: bench/gpu/run.sh [options]

Checks the CUDA path on a machine with an NVIDIA GPU, step by step; a failed step
is recorded and the later ones still run. The last thing printed is one Markdown
table (step | result | figure | reference) for docs/benchmarks.md.

Programs: --prebuilt DIR uses the folder bench/gpu/prepare.sh made on another
machine (no build, no -dev packages needed here): DIR/ddp.tar.xz is unpacked
into a temporary folder (or DIR/bin/ is used as it is: an unpacked cpack bundle
works too). Without --prebuilt the repository is configured and built into
--build-dir.

Steps (each under `timeout`, sized so that the run fits --budget on an H100):
  preflight     nvidia-smi's GPUs and compute capability against the build's CUDA
                architectures, and a tiny `train --device cuda:0`: a GPU the build
                cannot use stops the run here, loudly (exit 1)
  gpu_tests     ddp_gpu_tests (label gpu), one process per test suite (a crash loses
                one suite's results, and is named), XML to logs/gpu_tests.<suite>.xml;
                a test skipped for "no CUDA device" while nvidia-smi sees one fails
  gpt2_bf16     bench gpt --precision bf16 (tokens/s, MFU against the GPU's dense bf16
  gpt_mini_bf16 peak, peak device memory) vs PyTorch at its strictest (torch.compile,
                bf16 autocast, flash SDPA, fused AdamW, TF32: torch_gpt_train.py --strict)
                and its eager bf16 form; gpt2 124M and gpt-mini at batch 16; gpt-mini
                also with its step in a CUDA graph (bench gpt --cuda-graph yes); gpt2
                also with its head padded to 50304 columns (ours, padded_vocab=:
                what aligned logits' rows are worth to the head's matmuls); the
                longest ops of 3 profiled steps of ours (--profile-steps) next to the
                longest kernels of the strict PyTorch's (torch.profiler), per step
  bf16_loss     gpt-mini, 300 steps from one seed in fp32 and bf16 on the device: the
                mean loss of the last 50 steps within 2%
  reference_bf16  the reference below with --precision bf16, which the next four reproduce:
  ddp_bf16_nccl_w1, zero2_bf16_nccl_w1 (= reference_bf16, rtol 1e-4), ddp_bf16_shm_w2,
  dp_bf16_2replicas (half batches round their bf16 apart: no further from
                reference_bf16 than twice the fp32 reference is, checkpoint_distance.py)
  graph_mlp     train with and without --cuda-graph (mlp, cnn: Fashion-MNIST; gpt-mini:
  graph_cnn     bf16, batch 16, synthetic tokens): 30 steps' losses equal, exactly, and
  graph_gpt     no capture fallback; then ms/step of each over a longer run
  train_mlp     train --model mlp --epochs 3 on cuda:0; test accuracy vs the CPU's
  train_cnn     train --model cnn --epochs 1 on cuda:0; likewise
  parity_mlp    the same 50 (mlp) or 15 (cnn: max pooling's near-ties part the runs
  parity_cnn    later) steps on cpu and cuda:0 from the same seed (one Philox stream):
                every step's loss equal within 1e-4 (--loss-log)
  reference     train on cuda:0, batch 64, 100 steps, saved: what the next three
                must reproduce
  ddp_nccl_w1   ddprun -n 1 train --mode ddp, DDP_BACKEND=nccl: checkpoint = reference
  elastic_nccl_w1  the same under ddprun --on-failure continue (nccl's membership
                check while collectives are in flight, Note [nccl regroup]): = reference
  ddp_shm_w2    ddprun -n 2 train, both ranks on cuda:0, DDP_BACKEND=shm, batch 32
                per rank: checkpoint = reference (one process on the 2x batch)
  dp_2replicas  train --mode dp --devices cuda:0,cuda:0: checkpoint = reference
  zero2_nccl_w1 ddprun -n 1 train --zero 2, nccl (its reduce_scatter): checkpoint = reference
  zero1_shm_w2  ddprun -n 2 train --zero 1 / --zero 2, both ranks on cuda:0, shm, batch 32
  zero2_shm_w2  per rank (shard all_gather / reduce_scatter of device tensors): = reference
  parity_gpt    gpt-tiny, 30 steps on cpu and cuda:0 (synthetic tokens): losses within 1e-3
  ddp_gpt_nccl_w1  the same under ddprun -n 1, nccl, several buckets: = the cuda:0 losses
  bench_device  bench device: rand on the device vs host + copy, pinned vs pageable
                copies against PyTorch's pinned copy peak, the caching allocator, the
                memory-bound kernels' bytes per second against a device copy's
  planted_faults  bench/gpu/planted_faults.sh: each kernel's gpu tests run with a fault
                planted in its output (DDP_TEST_PLANT_FAULT, Note [planted faults] in
                runtime/planted_fault.h; the table bench/gpu/planted_faults.txt) and
                must fail; with --device cpu, the table's CPU column and ddp_unit_tests
  kernel_sanitizer  compute-sanitizer's memcheck (every tensor its own exact cudaMalloc:
                DDP_NO_CUDA_MEMORY_CACHING=1), racecheck and synccheck on the
                hand-written kernels' gpu tests (what the emulated device cannot see:
                races, barriers, bad device accesses): 0 errors; skipped, named,
                where the tool is missing or refuses the device
  bench_gemm    bench gemm: ours vs bare cuBLAS
  torch_mlp     ms per training step, ours vs PyTorch eager on the same GPU
  torch_cnn     (bench/peer/torch_train.py; skipped without a CUDA PyTorch)
  gpt_mini      tokens/s of a gpt-mini training step (bench gpt, batch 16) vs PyTorch
  gpt2          eager fp32 (bench/peer/torch_gpt_train.py); gpt2 124M at batch 4

options:
  --prebuilt DIR    programs from DIR (bench/gpu/prepare.sh); no configure, no build
  --build-dir DIR   build here when not --prebuilt (default: build-gpu in the repository)
  --arch LIST       CMAKE_CUDA_ARCHITECTURES of that build (default: 90)
  --prefix DIR      where missing -dev packages were unpacked (CMAKE_PREFIX_PATH); repeatable
  --no-tests        build without GoogleTest (no gpu_tests step)
  --jobs N          build jobs (default: number of cores)
  --data DIR        Fashion-MNIST folder (default: DIR/data/fashion-mnist of --prebuilt,
                    else /usr/share/datasets/fashion-mnist)
  --out DIR         results (default: $OUT when set, else build-gpu-results in the
                    repository, which .gitignore's /build*/ covers)
  --only LIST       run only these steps (comma-separated names above; preflight always runs)
  --quick           the steps that fit a short device loan: --only gpu_tests,
                    graph_mlp, graph_gpt, the bf16 steps, parity_mlp, parity_gpt,
                    reference, ddp_nccl_w1, elastic_nccl_w1, then bench_device
                    (its kernels' bytes per second against a copy) where --budget
                    leaves it 90 s, planted_faults where it leaves 120 s and
                    kernel_sanitizer where it leaves 150 s (else they are skipped,
                    not failed)
  --budget S        seconds for all steps after the build (default: 540, so that a run
                    fits a 10-minute command with --prebuilt); each step's time limit is
                    cut to what is left, and steps with nothing left fail as "not run";
                    0: no budget
  --allow-no-gpu    without a GPU, run what can run (CUDA steps report "skipped: no GPU")
                    instead of stopping: a smoke test of this script on any machine
  --device DEV      the device of the CUDA steps (default: cuda:0). With --allow-no-gpu,
                    --device cpu runs those steps on the CPU instead of skipping them
                    (nccl excepted): a test of this script's logic, not of CUDA
  --emulated        the CUDA steps on the CUDA device emulated on the CPU (Note [emulated
                    CUDA device]): programs of a -DDDP_CUDA=EMULATE build (--prebuilt
                    BUILD_DIR of `deploy/test.sh --emulate-cuda`, or built here into
                    --build-dir, default build-gpu-emulated), DDP_CUDA_EMULATION=2 devices
                    unless it is set; no nvidia-smi needed. The kernels' own source and
                    this script's CUDA branches run before a GPU is lent; speed does not.
                    Steps the emulation cannot run are skipped, naming why: the nccl
                    steps, graph_* (no CUDA graphs), bf16_loss and train_cnn (too long
                    there) and the speed steps (gpt2_bf16, gpt_mini_bf16, bench_*, torch_*, gpt_mini,
                    gpt2). Every other step runs (of --only's or --quick's, when given)
  -h, --help        this help

environment: PYTHON (default python3) runs PyTorch and the result parsing.

Results under --out: summary.md (environment and the table), run.log (every step's
output in order), bench_device.jsonl, bench_gemm.jsonl, and the
per-step logs, loss logs and metrics in logs/ -- packed into logs.tar.gz when the
results go to $OUT (a device machine returns at most 8 files).

Exit code: 0 when every step that ran passed, 1 when any failed (or the preflight
found a GPU the build cannot use, or no GPU without --allow-no-gpu), 2 usage error.
EOF
}

# ---- options -------------------------------------------------------------------
prebuilt="" build_dir="${repo_root}/build-gpu" arch="90" with_tests=1
jobs="$(nproc 2>/dev/null || echo 4)" data="" out="" only="" allow_no_gpu=0
prefixes=() dev=cuda:0 budget=540 emulated=0 build_dir_set=0
optional="" # --quick's steps that run only where --budget leaves time (skipped, not failed)
python="${PYTHON:-python3}"

die_usage() { echo "run.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die_usage "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prebuilt) need_value "$@"; prebuilt="$2"; shift 2 ;;
    --build-dir) need_value "$@"; build_dir="$2"; build_dir_set=1; shift 2 ;;
    --arch) need_value "$@"; arch="$2"; shift 2 ;;
    --prefix) need_value "$@"; prefixes+=("$2"); shift 2 ;;
    --no-tests) with_tests=0; shift ;;
    --jobs) need_value "$@"; jobs="$2"; shift 2 ;;
    --data) need_value "$@"; data="$2"; shift 2 ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --only) need_value "$@"; only=",$2,"; shift 2 ;;
    --quick)
      only=",gpu_tests,graph_mlp,graph_gpt,gpt2_bf16,gpt_mini_bf16,bf16_loss,reference_bf16,ddp_bf16_nccl_w1,zero2_bf16_nccl_w1,ddp_bf16_shm_w2,dp_bf16_2replicas,parity_mlp,parity_gpt,reference,ddp_nccl_w1,elastic_nccl_w1,bench_device,planted_faults,kernel_sanitizer,"
      optional=",bench_device,planted_faults,kernel_sanitizer,"
      shift
      ;;
    --allow-no-gpu) allow_no_gpu=1; shift ;;
    --emulated) emulated=1; shift ;;
    --device) need_value "$@"; dev="$2"; shift 2 ;;
    --budget) need_value "$@"; budget="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown option '$1'; valid: --prebuilt, --build-dir, --arch, --prefix, --no-tests, --jobs, --data, --out, --only, --quick, --allow-no-gpu, --device, --emulated, --budget, --help" ;;
  esac
done
readonly kSteps=",gpu_tests,gpt2_bf16,gpt_mini_bf16,bf16_loss,reference_bf16,ddp_bf16_nccl_w1,zero2_bf16_nccl_w1,ddp_bf16_shm_w2,dp_bf16_2replicas,graph_mlp,graph_cnn,graph_gpt,train_mlp,train_cnn,parity_mlp,parity_cnn,reference,ddp_nccl_w1,elastic_nccl_w1,ddp_shm_w2,dp_2replicas,zero2_nccl_w1,zero1_shm_w2,zero2_shm_w2,parity_gpt,ddp_gpt_nccl_w1,bench_device,planted_faults,kernel_sanitizer,bench_gemm,torch_mlp,torch_cnn,gpt_mini,gpt2,"
for name in ${only//,/ }; do
  [[ $kSteps == *",$name,"* ]] || die_usage "--only: unknown step '$name'; valid: ${kSteps:1:-1}"
done
[[ $budget =~ ^[0-9]+$ ]] || die_usage "--budget '$budget': expected whole seconds (0: no budget)"
[[ $dev == cpu || $dev =~ ^cuda(:[0-9]+)?$ ]] || die_usage "--device '$dev': valid values are cuda:N, cpu"
[[ $dev == cpu && $emulated -eq 1 ]] && die_usage "--emulated runs the CUDA steps on the emulated CUDA device: drop --device cpu"
[[ $dev == cpu && $allow_no_gpu -eq 0 ]] && die_usage "--device cpu is for testing this script: add --allow-no-gpu"
if [[ $emulated -eq 1 ]]; then
  [[ $build_dir_set -eq 0 ]] && build_dir="${repo_root}/build-gpu-emulated"
  [[ -z "${DDP_CUDA_EMULATION:-}" ]] && export DDP_CUDA_EMULATION=2
  # The emulated cuBLAS's OpenBLAS would leave idle threads spinning on the other
  # cores between its GEMMs (docs/building.md, "The emulated CUDA device").
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
  [[ $DDP_CUDA_EMULATION =~ ^[1-8]$ ]] ||
    die_usage "--emulated: DDP_CUDA_EMULATION='$DDP_CUDA_EMULATION' is not a device count 1..8 (unset it for 2)"
fi
[[ -z "$prebuilt" || -d "$prebuilt/bin" || -f "$prebuilt/ddp.tar.xz" ]] ||
  die_usage "--prebuilt $prebuilt: neither ddp.tar.xz nor bin/ there (make it with bench/gpu/prepare.sh)"
[[ -n "$prebuilt" ]] && prebuilt="$(cd "$prebuilt" && pwd)"
if [[ -z "$data" ]]; then
  data=/usr/share/datasets/fashion-mnist
  [[ -n "$prebuilt" && -d "$prebuilt/data/fashion-mnist" ]] && data="$prebuilt/data/fashion-mnist"
fi
pack_logs=0
if [[ -z "$out" ]]; then
  if [[ -n "${OUT:-}" ]]; then out="$OUT"; pack_logs=1; else out="$repo_root/build-gpu-results"; fi
fi
mkdir -p "$out/logs" || die_usage "--out $out: cannot create it"
out="$(cd "$out" && pwd)"
logs="$out/logs"
run_log="$out/run.log"
: >"$run_log"
rows="$out/.rows.tsv" # removed by finish
: >"$rows"
failed=0

say() { echo "== run.sh: $*" | tee -a "$run_log" >&2; }
selected() { [[ -z "$only" || "$only" == *",$1,"* ]]; }

# record STEP RESULT FIGURE REFERENCE: one table row; a RESULT starting with
# FAILED makes the exit code 1.
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "${3:--}" "${4:--}" >>"$rows"
  [[ "$2" == FAILED* ]] && failed=1
  say "$1: $2${3:+ | $3}"
  write_summary # after every step: a run killed from outside still leaves its table
}

# The time budget of the steps after the build (--budget): each step's limit is
# cut to what is left, and a step with nothing left is not run.
budget_start=$SECONDS
remaining() { echo $((budget - (SECONDS - budget_start))); }

# run_logged STEP.PART SECONDS CMD...: runs CMD under timeout into logs/STEP.PART.log
# (appended to run.log too); returns its exit code, 124 for a timeout.
run_logged() {
  local name=$1 limit=$2 rc start
  shift 2
  if [[ $budget -gt 0 ]]; then
    if [[ $(remaining) -lt 10 ]]; then
      echo "run.sh: $name not run: the --budget of $budget s is spent" >"$logs/$name.log"
      return 125
    fi
    [[ $(remaining) -lt $limit ]] && limit=$(remaining)
  fi
  start=$SECONDS
  {
    echo "\$ $*"
    timeout -k 10 "$limit" "$@"
  } >"$logs/$name.log" 2>&1
  rc=$?
  {
    echo "---- $name (exit $rc, $((SECONDS - start)) s) ----"
    cat "$logs/$name.log"
  } >>"$run_log"
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "run.sh: $name timed out after ${limit} s" >>"$logs/$name.log"
  return "$rc"
}

# why_failed STEP.PART RC: a short reason for the table (the log's last error line).
why_failed() {
  local log="$logs/$1.log" rc=$2 line
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "timed out (logs/$1.log)"; return; fi
  if [[ $rc -eq 125 ]]; then echo "not run: the --budget of $budget s was spent"; return; fi
  line=$(grep -E 'error|Error|FAIL|failed|not available|what\(\)' "$log" 2>/dev/null | grep -v '^\$ ' | tail -1 |
    cut -c1-160 | tr '|\t' '/ ')
  echo "exit $rc${line:+: $line} (logs/$1.log)"
}

results() { "$python" "$here/results.py" "$@"; }

# ---- CUDA libraries: the programs need libcudart, libcublas(Lt), libnccl ----------
# They come from the machine: the CUDA toolkit, else PyTorch's pip wheels (nvidia.*),
# where NCCL often lives alone. Every missing one found there is added to
# LD_LIBRARY_PATH.
wheel_lib_dirs() {
  "$python" - <<'PY' 2>/dev/null
import importlib, os
seen = set()
for name in ("nvidia", "nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13"):
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    for base in getattr(module, "__path__", []):
        for root, _, files in os.walk(base):
            if any(".so" in f for f in files) and root not in seen:
                seen.add(root)
                print(root)
PY
}

missing_libs() { # the libraries ldd cannot find for the given programs
  local exe
  for exe in "$@"; do [[ -x "$exe" ]] && ldd "$exe" 2>/dev/null; done |
    sed -nE 's/^\s*(\S+) => not found.*/\1/p' | sort -u
}

find_cuda_libs() {
  local lib dir found dirs=()
  local search=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib)
  mapfile -t dirs < <(wheel_lib_dirs)
  search+=("${dirs[@]}")
  for lib in $(missing_libs "${programs[@]}"); do
    found=""
    for dir in "${search[@]}"; do
      if [[ -e "$dir/$lib" ]]; then found=$dir; break; fi
    done
    if [[ -n "$found" ]]; then
      export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      say "$lib: from $found (added to LD_LIBRARY_PATH)"
    fi
  done
}

# ---- environment -----------------------------------------------------------------
gpu_count=0 gpu_cc="" gpu_name=""
describe_machine() {
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host: $(uname -srm), $(nproc) cores"
    echo "commit: $(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 |
        sed 's/^/gpu: /'
    else
      echo "gpu: none (no nvidia-smi)"
    fi
    [[ $emulated -eq 1 ]] && echo "emulated: ${DDP_CUDA_EMULATION} CUDA device(s) on the CPU (--emulated)"
    "$python" -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null ||
      echo "torch: not importable by $python"
  } >"$logs/env.log"
  cat "$logs/env.log" >>"$run_log"
  if command -v nvidia-smi >/dev/null; then
    local line
    line=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)
    gpu_count=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c '^[0-9]')
    gpu_name=${line%%,*}
    gpu_cc=$(tr -d ' ' <<<"${line##*,}")
  fi
}

# The build's CUDA architectures ("80,90") from the prebuilt folder's BUILD_INFO,
# or the generated config.h of a build tree (--prebuilt BUILD_DIR works too).
build_archs() {
  local f
  for f in "$prebuilt/BUILD_INFO" "$prebuilt/generated/ddp/config.h" "$build_dir/generated/ddp/config.h"; do
    [[ -f "$f" ]] || continue
    sed -nE 's/^cuda_archs=(.*)/\1/p; s/^#define DDP_CUDA_ARCHITECTURES "(.*)"/\1/p' "$f" | head -1
    return
  done
}

# ---- build or prebuilt ---------------------------------------------------------------
bin="" unpacked=""
# The unpacked prebuilt folder goes on every exit (finish, an error, a signal).
trap '[[ -z "$unpacked" ]] || rm -rf "$unpacked"' EXIT
# unpack TARBALL DIR: tar with xz, else Python's tarfile (a machine without xz).
unpack() {
  mkdir -p "$2" || return 1
  if command -v xz >/dev/null; then
    tar -xJf "$1" -C "$2"
  else
    "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
  fi
}

step_build() {
  if [[ -n "$prebuilt" ]]; then
    local from="$prebuilt" info
    info=$(sed -nE 's/^commit=(.*)/commit \1/p; s/^cuda_archs=(.*)/archs \1/p' "$prebuilt/BUILD_INFO" 2>/dev/null |
      tr '\n' ' ' | sed 's/ $//')
    if [[ ! -d "$prebuilt/bin" ]]; then
      unpacked=$(mktemp -d "${TMPDIR:-/tmp}/ddp-prebuilt.XXXXXX")
      if ! unpack "$prebuilt/ddp.tar.xz" "$unpacked" >"$logs/build.unpack.log" 2>&1 ||
        [[ ! -d "$unpacked/ddp/bin" ]]; then
        record build "FAILED: cannot unpack $prebuilt/ddp.tar.xz (logs/build.unpack.log)"
        return
      fi
      from="$unpacked/ddp"
    fi
    bin="$from/bin"
    record build "ok" "prebuilt: ${info:-no BUILD_INFO}" "$prebuilt"
    return
  fi
  local cuda_args=(-DDDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch")
  [[ $emulated -eq 1 ]] && cuda_args=(-DDDP_CUDA=EMULATE)
  local args=(-S "$repo_root" -B "$build_dir" "${cuda_args[@]}" -DCMAKE_BUILD_TYPE=Release)
  command -v ninja >/dev/null && args+=(-G Ninja)
  [[ $with_tests -eq 0 ]] && args+=(-DDDP_BUILD_TESTS=OFF)
  if [[ ${#prefixes[@]} -gt 0 ]]; then args+=("-DCMAKE_PREFIX_PATH=$(IFS=';'; echo "${prefixes[*]}")"); fi
  local rc part=build.configure
  run_logged "$part" 300 cmake "${args[@]}"
  rc=$?
  if [[ $rc -eq 0 ]]; then
    part=build.compile
    run_logged "$part" 1800 cmake --build "$build_dir" -j "$jobs"
    rc=$?
  fi
  if [[ $rc -eq 0 ]]; then
    bin="$build_dir/bin"
    record build "ok" "$([[ $emulated -eq 1 ]] && echo "emulated CUDA" || echo "sm_${arch}") in $build_dir" "-"
  else
    record build "FAILED: $(why_failed "$part" "$rc")"
  fi
}

# ---- preflight: a GPU the build cannot use stops the run ---------------------------
cuda=0 # 1: CUDA steps run
preflight() {
  local archs cc_arch a ok=0 below=0 rc
  [[ $emulated -eq 1 ]] && { preflight_emulated; return; }
  archs=$(build_archs)
  if [[ $gpu_count -eq 0 ]]; then
    if [[ $allow_no_gpu -eq 1 ]]; then
      record preflight "skipped: no GPU (--allow-no-gpu)" "build archs ${archs:-unknown}" "-"
      return 0
    fi
    echo "run.sh: FAIL: no GPU: nvidia-smi $(command -v nvidia-smi >/dev/null && echo "lists none" || echo "is not installed")." \
      "This script checks the CUDA path and needs one; --allow-no-gpu runs what can run without it." >&2
    record preflight "FAILED: no GPU (nvidia-smi sees none; --allow-no-gpu to run anyway)"
    return 1
  fi
  if [[ ! $gpu_cc =~ ^[0-9]+\.[0-9]+$ ]]; then # a driver too old for --query-gpu=compute_cap
    gpu_cc=$("$python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null)
  fi
  cc_arch=${gpu_cc/./}
  for a in ${archs//[,;]/ }; do
    [[ -n "$cc_arch" ]] || break
    a=${a%%-*} # 90-real, 90-virtual
    [[ "$a" == "$cc_arch" ]] && ok=1
    [[ "$a" =~ ^[0-9]+$ && "$a" -lt "$cc_arch" ]] && below=1
  done
  if [[ -z "$archs" || -z "$cc_arch" ]]; then # the tiny train run below decides
    say "WARNING: not compared: the build's CUDA architectures (${archs:-unknown: no BUILD_INFO or config.h})" \
      "with the GPU's compute capability (${gpu_cc:-unknown})"
  elif [[ $ok -eq 0 && $below -eq 0 ]]; then
    echo "run.sh: FAIL: nvidia-smi sees ${gpu_name} (compute capability ${gpu_cc}) but this build has CUDA code" \
      "only for architectures ${archs}, all newer than sm_${cc_arch}: no kernel can run. Rebuild with --arch ${cc_arch}" \
      "(bench/gpu/prepare.sh --arch ${cc_arch}, or run.sh --arch ${cc_arch} without --prebuilt)." >&2
    record preflight "FAILED: build archs ${archs} cannot run on compute capability ${gpu_cc}"
    return 1
  elif [[ $ok -eq 0 ]]; then
    say "WARNING: no sm_${cc_arch} code in this build (archs ${archs}): kernels are JIT-compiled from PTX at start-up"
  fi
  local gpu=$dev
  [[ $gpu == cpu ]] && gpu=cuda:0
  run_logged preflight 120 "$bin/train" --data synthetic --synthetic-size 256 --epochs 1 --batch-size 64 \
    --device "$gpu" --quiet
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "run.sh: FAIL: nvidia-smi sees ${gpu_count} GPU(s) (${gpu_name}, compute capability ${gpu_cc}) but" \
      "\`train --device $gpu\` cannot use it (build archs ${archs:-unknown}): $(why_failed preflight "$rc")" >&2
    sed 's/^/  | /' "$logs/preflight.log" | tail -15 >&2
    record preflight "FAILED: the build cannot use the GPU: $(why_failed preflight "$rc")" \
      "${gpu_name}, cc ${gpu_cc}" "build archs ${archs}"
    return 1
  fi
  cuda=1
  record preflight "ok" "${gpu_count} x ${gpu_name}, compute capability ${gpu_cc}" "build archs ${archs}"
}

# build_emulation: 1 when the build's config.h says DDP_CUDA_EMULATION 1, 0 when it
# says 0, empty when there is none to read (a prepare.sh bundle).
build_emulation() {
  local f
  for f in "$prebuilt/generated/ddp/config.h" "$build_dir/generated/ddp/config.h"; do
    [[ -n "$prebuilt" && $f == "$build_dir"/* ]] && continue
    [[ -f "$f" ]] || continue
    sed -nE 's/^#define DDP_CUDA_EMULATION ([01])$/\1/p' "$f" | head -1
    return
  done
}

# --emulated: the build must emulate CUDA, and its tiny train must run on cuda:0.
preflight_emulated() {
  local rc what="${DDP_CUDA_EMULATION} emulated CUDA device(s) (DDP_CUDA_EMULATION)"
  gpu_name="emulated CUDA device (CPU)"
  if [[ $(build_emulation) == 0 ]]; then
    echo "run.sh: FAIL: --emulated, but the build in ${prebuilt:-$build_dir} is not a -DDDP_CUDA=EMULATE one" \
      "(DDP_CUDA_EMULATION 0 in its config.h). Build one with -DDDP_CUDA=EMULATE" \
      "(deploy/test.sh --emulate-cuda --build-dir DIR, then --prebuilt DIR), or drop --emulated on a GPU machine." >&2
    record preflight "FAILED: --emulated needs a -DDDP_CUDA=EMULATE build" "-" "${prebuilt:-$build_dir}"
    return 1
  fi
  run_logged preflight 120 "$bin/train" --data synthetic --synthetic-size 256 --epochs 1 --batch-size 64 \
    --device "$dev" --quiet
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "run.sh: FAIL: --emulated: \`train --device $dev\` cannot use the $what: $(why_failed preflight "$rc")." \
      "Is ${prebuilt:-$build_dir} a -DDDP_CUDA=EMULATE build (deploy/test.sh --emulate-cuda)?" >&2
    sed 's/^/  | /' "$logs/preflight.log" | tail -15 >&2
    record preflight "FAILED: the emulated device cannot run train: $(why_failed preflight "$rc")" "$what"
    return 1
  fi
  cuda=1
  record preflight "ok" "$what" "no GPU: the kernels' source on the CPU"
}

# emulation_lacks STEP: why the emulated CUDA device cannot run STEP; nothing when it can.
emulation_lacks() {
  case "$1" in
    *nccl*) echo "nccl is absent from the emulated device" ;;
    graph_*) echo "CUDA graphs are absent from the emulated device" ;;
    bf16_loss) echo "600 gpt-mini steps take hours on the emulated device (e2e.train_autocast checks bf16 on the CPU)" ;;
    train_cnn) echo "an epoch of the CNN takes about an hour on the emulated device (parity_cnn runs its kernels)" ;;
    gpt2_bf16 | gpt_mini_bf16 | bench_* | torch_* | gpt_mini | gpt2)
      echo "a speed step: the emulated device's speed says nothing of a GPU's" ;;
  esac
}

# skip_emulation_lacks: with --emulated, the selected steps the emulation lacks leave the
# selection; their "skipped" rows are recorded at the end (skipped_rows).
skipped_rows=()
skip_emulation_lacks() {
  local name why kept=","
  [[ $emulated -eq 1 ]] || return 0
  for name in $(tr ',' ' ' <<<"${only:-$kSteps}"); do
    why=$(emulation_lacks "$name")
    if [[ -n "$why" ]]; then skipped_rows+=("$name"$'\t'"skipped: $why (--emulated)"); else kept+="$name,"; fi
  done
  only=$kept
}

# ---- steps: bench/gpu/steps.sh ---------------------------------------------------
# shellcheck source=bench/gpu/steps.sh
. "$here/steps.sh"

# ---- the table -----------------------------------------------------------------------
# summary.md: the machine and the table so far.
write_summary() {
  {
    echo "# bench/gpu/run.sh"
    echo
    sed 's/^/    /' "$logs/env.log" 2>/dev/null
    echo
    print_table
  } >"$out/summary.md"
}

print_table() {
  {
    echo "| step | result | figure | reference |"
    echo "|---|---|---|---|"
    # A '|' inside a cell would end it: escaped.
    while IFS=$'\t' read -r s r f ref; do
      echo "| ${s//|/\\|} | ${r//|/\\|} | ${f//|/\\|} | ${ref//|/\\|} |"
    done <"$rows"
  }
}

finish() {
  local table
  write_summary
  table=$(print_table)
  rm -f "$rows"
  if [[ $pack_logs -eq 1 ]]; then
    tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
  fi
  echo
  echo "results: $out (summary.md, run.log$([[ $pack_logs -eq 1 ]] && echo ", logs.tar.gz" || echo ", logs/"))"
  [[ $failed -eq 0 ]] && echo "all steps that ran passed" || echo "SOME STEPS FAILED (exit 1)"
  echo
  echo "$table"
  exit "$failed"
}

# ---- main ------------------------------------------------------------------------------
describe_machine
say "results in $out; GPUs seen by nvidia-smi: $gpu_count${gpu_name:+ ($gpu_name, compute capability $gpu_cc)}"
step_build
budget_start=$SECONDS
if [[ -z "$bin" ]]; then
  record preflight "skipped: no programs (the build failed)"
  finish
fi
programs=("$bin/train" "$bin/bench" "$bin/ddprun" "$bin/ddp_gpu_tests")
find_cuda_libs
if [[ -n "$(missing_libs "${programs[@]}")" ]]; then
  record libraries "FAILED: not found: $(missing_libs "${programs[@]}" | tr '\n' ' ')" "-" \
    "CUDA toolkit or PyTorch's nvidia.* wheels"
fi
if ! preflight; then
  failed=1
  finish
fi

skip_emulation_lacks
run_steps
for row in ${skipped_rows[@]+"${skipped_rows[@]}"}; do record "${row%%$'\t'*}" "${row#*$'\t'}"; done
finish
