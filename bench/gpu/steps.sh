# shellcheck shell=bash
# The steps of bench/gpu/run.sh, sourced by it: each runs its programs through
# run_logged and ends in one or more `record` rows of the table. They use
# run.sh's state (bin, dev, data, logs, out, cuda, gpu_count, ...).
# shellcheck disable=SC2154  # run.sh's variables

# skip_cuda STEP [REFERENCE]: records "skipped: no GPU" and returns 0 when CUDA
# steps cannot run (on --device cpu they run there).
skip_cuda() {
  [[ $cuda -eq 1 || $dev == cpu ]] && return 1
  record "$1" "skipped: no GPU" "-" "${2:--}"
  return 0
}
have_data() {
  [[ -f "$data/train-images-idx3-ubyte.gz" || -f "$data/train-images-idx3-ubyte" ]] && return 0
  record "$1" "FAILED: no Fashion-MNIST in $data (pass --data DIR, or carry it with prepare.sh)"
  return 1
}

# One process per test suite (logs/gpu_tests.<suite>.log and .xml), within 300 s in
# all: a test that kills its process (an illegal address, an abort) loses its suite's
# results, not every suite's (gtest writes its XML only at the end), and the table
# names the suites that died.
step_gpu_tests() {
  local exe="$bin/ddp_gpu_tests" rc=0 r figure skips suite name left deadline
  local -a suites=() died=()
  if [[ ! -x "$exe" ]]; then
    record gpu_tests "$([[ $with_tests -eq 0 ]] && echo "skipped: --no-tests" || echo "FAILED: $exe is missing")"
    return
  fi
  mapfile -t suites < <("$exe" --gtest_list_tests 2>/dev/null | grep -E '^[A-Za-z0-9_/]+\.$' | sed 's/\.$//')
  if [[ ${#suites[@]} -eq 0 ]]; then
    record gpu_tests "FAILED: $exe --gtest_list_tests listed no test suites" "-" "all pass"
    return
  fi
  rm -f "$logs"/gpu_tests.*.xml
  deadline=$((SECONDS + 300))
  for suite in "${suites[@]}"; do
    name="gpu_tests.${suite//\//_}"
    left=$((deadline - SECONDS))
    [[ $left -lt 10 ]] && left=10
    run_logged "$name" "$left" "$exe" --gtest_filter="$suite.*" \
      --gtest_output="xml:$logs/$name.xml" --gtest_color=no
    r=$?
    if [[ $r -eq 125 ]]; then  # the --budget is spent: the rest do not run
      rc=$r
      died+=("$suite and the suites after it (not run: the --budget was spent)")
      break
    fi
    if [[ $r -ne 0 ]]; then
      rc=$r
      [[ -s "$logs/$name.xml" ]] || died+=("$suite (exit $r, logs/$name.log)")
    fi
  done
  figure=$(results gtest "$logs/gpu_tests.*.xml" 2>>"$logs/gpu_tests.log") || true
  skips=$(results no-cuda-skips "$logs/gpu_tests.*.xml" 2>/dev/null || echo 0)
  if [[ ${#died[@]} -gt 0 ]]; then
    record gpu_tests "FAILED: no results from ${died[*]}" "$figure" "all pass"
  elif [[ $rc -ne 0 ]]; then
    record gpu_tests "FAILED: exit $rc; $(grep -h '^FAILED' "$logs/gpu_tests.log" 2>/dev/null | head -3 | tr '\n' ' ')(logs/gpu_tests.*.log)" \
      "$figure" "all pass"
  elif [[ ($gpu_count -gt 0 || $emulated -eq 1) && "${skips:-0}" -gt 0 ]]; then
    record gpu_tests "FAILED: $skips tests skipped for 'no CUDA device' although $([[ $emulated -eq 1 ]] &&
      echo "DDP_CUDA_EMULATION=$DDP_CUDA_EMULATION emulates one" || echo "nvidia-smi sees ${gpu_name}")" \
      "$figure" "all pass"
  elif [[ $cuda -eq 0 ]]; then
    record gpu_tests "skipped: no GPU (the tests ran: they skip)" "$figure" "all pass"
  elif [[ $emulated -eq 1 ]]; then
    record gpu_tests "ok" "$figure" "all pass; skips: nccl, and what the emulation lacks (DDP_REQUIRE_REAL_CUDA)"
  else
    record gpu_tests "ok" "$figure" "all pass; skips only for two-GPU cases"
  fi
}

# CPU test accuracy of the same flags (train --model M --epochs E --device cpu
# --data <Fashion-MNIST> --log-every 200), measured on the development machine
# (2026-11-25, commit 7c8039a): the reference for train_mlp / train_cnn.
# CPU and CUDA start from the same Philox stream and see the same batches, so
# they end within rounding; the tolerance allows for the different summation order.
readonly kMlpCpuAcc=0.8800 kCnnCpuAcc=0.8828 kAccTolerance=0.01

# train_step STEP MODEL EPOCHS CPU_ACC
train_step() {
  local step=$1 model=$2 epochs=$3 ref=$4 rc acc step_ms
  selected "$step" || return
  have_data "$step" || return
  skip_cuda "$step" "cpu test_acc $ref" && return
  run_logged "$step" 300 "$bin/train" --model "$model" --epochs "$epochs" --device "$dev" --data "$data" \
    --log-every 200 --metrics "$logs/$step.metrics.jsonl"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: $(why_failed "$step" "$rc")" "-" "cpu test_acc $ref"; return; fi
  acc=$(results summary-acc "$logs/$step.log")
  step_ms=$(results metric "$logs/$step.metrics.jsonl" step_ms)
  local figure="test_acc $acc after $epochs epoch(s), ${step_ms} ms/step"
  if awk -v a="$acc" -v r="$ref" -v t="$kAccTolerance" 'BEGIN { exit !(a + 0 >= r - t) }'; then
    record "$step" "ok" "$figure" "cpu test_acc $ref (-$kAccTolerance allowed)"
  else
    record "$step" "FAILED: accuracy below the CPU's" "$figure" "cpu test_acc $ref (-$kAccTolerance allowed)"
  fi
}

# graph_step STEP STEPS TRAIN_ARGS... (graph_mlp, graph_cnn, graph_gpt; Note [graphed
# steps] in trainer/epoch.cpp): `train TRAIN_ARGS` with and without --cuda-graph on the
# device. 30 steps with --loss-log: every step's loss equal (a replay runs the eager
# step's kernels on the same numbers), and no "could not be captured" fallback; then
# STEPS steps of each without --loss-log (its read of every loss would time the host's
# waits too): ms per step from --metrics, where capturing the step pays.
graph_step() {
  local step=$1 steps=$2 rc line mode eager_ms graph_ms
  shift 2
  selected "$step" || return
  [[ " $* " == *" $data "* ]] && { have_data "$step" || return; }
  skip_cuda "$step" "losses equal; ms/step eager vs graph" && return
  if [[ $dev == cpu ]]; then record "$step" "skipped: --cuda-graph needs CUDA (--device cpu)"; return; fi
  for mode in eager graph; do
    local graph_flag=()
    [[ $mode == graph ]] && graph_flag=(--cuda-graph)
    run_logged "$step.$mode" 180 "$bin/train" "$@" --device "$dev" "${graph_flag[@]}" --max-steps 30 \
      --loss-log "$logs/$step.$mode.loss"
    rc=$?
    if [[ $rc -ne 0 ]]; then record "$step" "FAILED: the $mode run: $(why_failed "$step.$mode" "$rc")"; return; fi
  done
  if grep -q "could not be captured" "$logs/$step.graph.log"; then
    record "$step" "FAILED: the step was not captured: $(grep -m1 'could not be captured' "$logs/$step.graph.log" |
      cut -c1-200 | tr '|\t' '/ ')"
    return
  fi
  line=$(results losses "$logs/$step.eager.loss" "$logs/$step.graph.loss" 0)
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: the replayed steps' losses differ" "$line" "= eager, exactly"; return; fi
  for mode in eager graph; do
    local graph_flag=()
    [[ $mode == graph ]] && graph_flag=(--cuda-graph)
    run_logged "$step.$mode.timed" 180 "$bin/train" "$@" --device "$dev" "${graph_flag[@]}" --max-steps "$steps" \
      --metrics "$logs/$step.$mode.metrics.jsonl"
    rc=$?
    if [[ $rc -ne 0 ]]; then record "$step" "FAILED: the timed $mode run: $(why_failed "$step.$mode.timed" "$rc")"; return; fi
  done
  eager_ms=$(results metric "$logs/$step.eager.metrics.jsonl" step_ms)
  graph_ms=$(results metric "$logs/$step.graph.metrics.jsonl" step_ms)
  record "$step" "ok" "$graph_ms ms/step with --cuda-graph vs $eager_ms eager ($(awk -v e="$eager_ms" \
    -v g="$graph_ms" 'BEGIN { printf "%.2fx", e / g }')); 30 steps' losses equal" "= eager, exactly"
}

# parity_step STEP MODEL STEPS: STEPS steps on cpu and on cuda:0, losses step by step.
# The CNN's runs part after ~15 steps on an H200 (2026-11-26): equal to 4e-6 through
# step 16, then 5e-5 at step 18 and ~1e-4..1e-3 after. That is max pooling taking
# another element of a window whose two largest values differ by less than the two
# devices' rounding, after which the trajectories separate; a wrong gradient shows at
# step 2. So the CNN is compared over its first 15 steps, the MLP over 50.
parity_step() {
  local step=$1 model=$2 steps=$3
  selected "$step" || return
  have_data "$step" || return
  loss_parity "$step" 1e-4 --model "$model" --epochs 1 --max-steps "$steps" --data "$data" --quiet --seed 3
}

# loss_parity STEP TOLERANCE TRAIN_ARGS...: `train TRAIN_ARGS` on cpu and on the
# device, every step's loss (--loss-log) equal within TOLERANCE.
loss_parity() {
  local step=$1 tolerance=$2 rc line
  shift 2
  local what="cpu = $dev within $tolerance per step"
  rm -f "$logs/$step.cpu.loss" "$logs/$step.cuda.loss"
  run_logged "$step.cpu" 300 "$bin/train" "$@" --device cpu --loss-log "$logs/$step.cpu.loss"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: the CPU run: $(why_failed "$step.cpu" "$rc")"; return; fi
  skip_cuda "$step" "losses within $tolerance" && return
  run_logged "$step.cuda" 180 "$bin/train" "$@" --device "$dev" --loss-log "$logs/$step.cuda.loss"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: the CUDA run: $(why_failed "$step.cuda" "$rc")"; return; fi
  line=$(results losses "$logs/$step.cpu.loss" "$logs/$step.cuda.loss" "$tolerance")
  rc=$?
  if [[ $rc -eq 0 ]]; then
    record "$step" "ok" "$line" "$what"
  else
    record "$step" "FAILED: CPU and CUDA losses differ" "$line" "$what"
  fi
}

# Shared by reference, ddp_* and dp_*: the global batch is 64 in every run.
# Not --quiet: the header line names the backend (checked below).
same_args=(--model mlp --epochs 1 --max-steps 100 --lr-schedule constant --seed 5)
readonly kCheckpointRtol=1e-4

# step_reference [NAME [TRAIN_ARGS...]]: the one-process run the compare steps reproduce
# (NAME reference: fp32; reference_bf16: --precision bf16).
step_reference() {
  local name=${1:-reference} rc
  shift || true
  have_data "$name" || return
  skip_cuda "$name" && return
  rm -f "$logs/$name.safetensors"  # a rerun's: train never replaces a later checkpoint
  run_logged "$name" 180 "$bin/train" "${same_args[@]}" "$@" --data "$data" --device "$dev" --batch-size 64 \
    --save "$logs/$name.safetensors"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$name" "FAILED: $(why_failed "$name" "$rc")"; return; fi
  record "$name" "ok" "test_acc $(results summary-acc "$logs/$name.log") (mlp, batch 64, 100 steps${1:+ $*})" "-"
  [[ $name == reference ]] && reference_done=1
}
reference_done=0

# compare_step STEP BACKEND_PATTERN REFERENCE_TEXT CMD...: runs CMD (which saves
# logs/STEP.safetensors), checks its log names BACKEND_PATTERN, compares with the reference.
compare_step() {
  local step=$1 pattern=$2 what=$3 rc line
  shift 3
  selected "$step" || return
  have_data "$step" || return
  skip_cuda "$step" "$what" && return
  local ref="${compare_ref:-reference}"
  if [[ ! -f "$logs/$ref.safetensors" ]]; then
    record "$step" "FAILED: no reference checkpoint (see the $ref step)" "-" "$what"
    return
  fi
  rm -f "$logs/$step.safetensors"
  run_logged "$step" 240 "$@" --save "$logs/$step.safetensors"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: $(why_failed "$step" "$rc")" "-" "$what"; return; fi
  if ! grep -qE "$pattern" "$logs/$step.log"; then
    record "$step" "FAILED: the log does not show /$pattern/" "-" "$what"
    return
  fi
  local rtol="${compare_rtol:-$kCheckpointRtol}"
  "$python" "$repo_root/tests/e2e/compare_checkpoints.py" "$logs/$ref.safetensors" \
    "$logs/$step.safetensors" --rtol "$rtol" >"$logs/$step.compare.log" 2>&1
  rc=$?
  line=$(grep -oE 'max difference [^ ]+' "$logs/$step.compare.log" | sort -k3 -g | tail -1)
  line="${line:-identical}; test_acc $(results summary-acc "$logs/$step.log" 2>/dev/null || echo '?')"
  if [[ $rc -eq 0 ]]; then
    record "$step" "ok" "checkpoint $line" "$what (rtol $rtol)"
  else
    record "$step" "FAILED: the checkpoint differs from the $ref (logs/$step.compare.log)" \
      "checkpoint $line" "$what (rtol $rtol)"
  fi
}

step_bench() {
  local sub=$1 rc
  selected "bench_$sub" || return
  skip_cuda "bench_$sub" && return
  if [[ $optional == *",bench_$sub,"* && $budget -gt 0 && $(remaining) -lt 90 ]]; then
    record "bench_$sub" "skipped: --quick runs it with 90 s of the --budget left, $(remaining) s were"
    return
  fi
  # shellcheck disable=SC2016  # the positional parameters of the inner shell
  run_logged "bench_$sub" 300 sh -c '"$1" "$2" --device "$3" --json >"$4"' sh "$bin/bench" "$sub" "$dev" \
    "$out/bench_$sub.jsonl"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "bench_$sub" "FAILED: $(why_failed "bench_$sub" "$rc")"; return; fi
  local peak="" label figure reference h2d d2h
  if [[ $sub == device ]]; then
    if [[ $dev == cuda* ]] && peak=$(results copy-peak "$dev" 2>>"$logs/bench_device.log"); then
      read -r h2d d2h <<<"$peak"
    fi
    while IFS=$'\t' read -r label figure; do
      reference="-"
      [[ $label == "host to device 256 MiB pinned" && -n "$peak" ]] && reference="PyTorch pinned copy $h2d GB/s"
      [[ $label == "device to host 256 MiB pinned" && -n "$peak" ]] && reference="PyTorch pinned copy $d2h GB/s"
      [[ $label == *pinned* && -z "$peak" ]] && reference="no CUDA PyTorch for the copy peak"
      record "bench_device: $label" "ok" "$figure" "$reference"
    done < <(results bench-device "$out/bench_device.jsonl")
  else
    while IFS=$'\t' read -r label figure reference; do
      record "bench_gemm: ${label#gemm }" "ok" "$figure" "$reference"
    done < <(results bench-gemm "$out/bench_gemm.jsonl")
  fi
}

# torch_can_run: PyTorch is importable and, for a CUDA --device, sees CUDA.
torch_can_run() {
  "$python" -c 'import sys, torch; sys.exit(0 if sys.argv[1] == "cpu" or torch.cuda.is_available() else 1)' \
    "$dev" 2>/dev/null
}

# torch_step STEP MODEL: ms per step of ours (epoch 2 of 2, 300 steps each) and of
# PyTorch eager (300 steps after 50 warmup), same model, batch, optimizer and data.
torch_step() {
  local step=$1 model=$2 rc ours theirs
  selected "$step" || return
  have_data "$step" || return
  skip_cuda "$step" && return
  if ! torch_can_run; then record "$step" "skipped: no CUDA PyTorch for $python"; return; fi
  rm -f "$logs/$step.ours.jsonl"
  run_logged "$step.ours" 240 "$bin/train" --model "$model" --epochs 2 --max-steps 300 --lr-schedule constant \
    --device "$dev" --data "$data" --quiet --metrics "$logs/$step.ours.jsonl"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: ours: $(why_failed "$step.ours" "$rc")"; return; fi
  run_logged "$step.torch" 240 "$python" "$repo_root/bench/peer/torch_train.py" --model "$model" --device "$dev" \
    --steps 300 --warmup 50 --sync-every 10 --data "$data"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: PyTorch: $(why_failed "$step.torch" "$rc")"; return; fi
  ours=$(results metric "$logs/$step.ours.jsonl" step_ms)
  theirs=$(results json-key "$logs/$step.torch.log" step_ms)
  record "$step" "ok" "ours $ours ms/step" \
    "PyTorch $theirs ms/step (ours/PyTorch $(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }'))"
}

# GPT: synthetic tokens (no corpus needed on the GPU machine): what a step computes
# does not depend on the token values.
readonly kGptLossTolerance=1e-3 # 30 AdamW steps through attention, LayerNorm and the
# vocabulary softmax, summed in another order on the GPU

# parity_gpt: gpt-tiny, 30 steps on cpu and on the device from the same seed.
step_parity_gpt() {
  selected parity_gpt || return
  # --eval-batches 2: the losses compared are the training steps'; the evaluation at the
  # end need not be long (it was most of the run on the emulated device).
  loss_parity parity_gpt "$kGptLossTolerance" --model gpt-tiny --data synthetic --epochs 1 --max-steps 30 \
    --eval-batches 2 --quiet --seed 3
}

# ddp_gpt_nccl_w1: the same 30 gpt-tiny steps under ddprun -n 1 with nccl (several
# buckets: --bucket-cap-mb 0.05) equal the single process's on the device.
step_ddp_gpt() {
  local step=ddp_gpt_nccl_w1 rc line
  selected "$step" || return
  skip_cuda "$step" && return
  [[ $dev == cpu ]] && { record "$step" "skipped: nccl needs CUDA (--device cpu)"; return; }
  if [[ ! -f "$logs/parity_gpt.cuda.loss" ]]; then
    record "$step" "FAILED: no single-process losses (see parity_gpt)"
    return
  fi
  run_logged "$step" 120 env DDP_BACKEND=nccl "$bin/ddprun" --standalone -n 1 "$bin/train" --model gpt-tiny \
    --data synthetic --epochs 1 --max-steps 30 --eval-batches 2 --seed 3 --mode ddp --bucket-cap-mb 0.05 \
    --device "$dev" --loss-log "$logs/$step.loss"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: $(why_failed "$step" "$rc")"; return; fi
  line=$(results losses "$logs/parity_gpt.cuda.loss" "$logs/$step.loss" 1e-5)
  rc=$?
  if [[ $rc -eq 0 ]]; then record "$step" "ok" "$line" "= one process on $dev within 1e-5"; else
    record "$step" "FAILED: DDP's losses differ from one process's" "$line" "= one process on $dev within 1e-5"; fi
}

# gpt_STEP MODEL BATCH: tokens/s of `bench gpt` (median step after warmup) and of
# PyTorch eager (bench/peer/torch_gpt_train.py) on the same device, model and batch.
gpt_speed_step() {
  local step=$1 model=$2 batch=$3 rc ours theirs ms
  selected "$step" || return
  skip_cuda "$step" && return
  # shellcheck disable=SC2016  # the positional parameters of the inner shell
  run_logged "$step.ours" 150 sh -c '"$1" gpt --device "$2" --model "$3" --batch-size "$4" --warmup 2 \
    --repeats 10 --json >"$5"' sh "$bin/bench" "$dev" "$model" "$batch" "$logs/$step.ours.jsonl"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: ours: $(why_failed "$step.ours" "$rc")"; return; fi
  ours=$(results json-key "$logs/$step.ours.jsonl" tokens_per_s)
  ms=$(results json-key "$logs/$step.ours.jsonl" step_ms)
  local figure="ours $ours tokens/s ($ms ms/step, batch $batch)"
  if ! torch_can_run; then record "$step" "ok" "$figure" "no CUDA PyTorch for $python"; return; fi
  local tdev=$dev
  [[ $tdev == cuda* ]] || tdev=cpu
  run_logged "$step.torch" 150 "$python" "$repo_root/bench/peer/torch_gpt_train.py" --model "$model" \
    --device "$tdev" --batch "$batch" --steps 10 --warmup 2
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: PyTorch: $(why_failed "$step.torch" "$rc")" "$figure"; return; fi
  theirs=$(results json-key "$logs/$step.torch.log" tokens_per_s)
  record "$step" "ok" "$figure" \
    "PyTorch $theirs tokens/s (ours/PyTorch $(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }'))"
}

# ---- bf16 mixed precision (issue 29; Note [autocast]) ----------------------------

# The dense bf16 peak of the GPU (TFLOP/s) for MFU, from nvidia-smi's name; 0 unknown.
bf16_peak_tflops() {
  case "$gpu_name" in
    *H100* | *H200* | *H800*) echo 989 ;;
    *A100* | *A800*) echo 312 ;;
    *L40S*) echo 362 ;;
    *) echo 0 ;;
  esac
}

# gpt_bf16_step STEP MODEL BATCH [graph|PADDED_SPEC]: tokens/s, MFU and peak device memory
# of `bench gpt --precision bf16` against PyTorch at its strictest (torch.compile, bf16
# autocast, flash SDPA, fused AdamW, TF32: torch_gpt_train.py --strict) and its eager bf16
# form, same model, batch and optimizer, on the same GPU. With `graph`, also ours with the
# step captured in a CUDA graph (bench gpt --cuda-graph yes), and its ratio to PyTorch.
# With a model spec (gpt:...), also ours on that model: GPT-2 with its head padded to
# 50304 columns (Note [padded head]: the same model and loss; nanoGPT and llm.c pad
# the vocabulary to 50304), whose logits' rows are 16-byte aligned for the head's
# matmuls (50257 bf16 columns are not), about 30% of the step's FLOPs.
gpt_bf16_step() {
  local step=$1 model=$2 batch=$3 rc peak ours ms mfu mem reserved raw figure graphed=""
  selected "$step" || return
  skip_cuda "$step" && return
  [[ $dev == cpu ]] && { record "$step" "skipped: bf16 autocast is for CUDA (--device cpu)"; return; }
  peak=$(bf16_peak_tflops)
  # shellcheck disable=SC2016  # the positional parameters of the inner shell
  # --profile-steps 3: then 3 steps under the op profile (Note [op profile]); --ops yes:
  # then each op alone (Note [gpt op breakdown]); both after the timed steps.
  run_logged "$step.ours" 180 sh -c '"$1" gpt --device "$2" --model "$3" --batch-size "$4" --precision bf16 \
    --peak-tflops "$6" --warmup 3 --repeats 10 --profile-steps 3 --ops yes --json >"$5"' sh "$bin/bench" "$dev" "$model" \
    "$batch" "$logs/$step.ours.jsonl" "$peak"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: ours: $(why_failed "$step.ours" "$rc")"; return; fi
  ours=$(results json-key "$logs/$step.ours.jsonl" tokens_per_s)
  ms=$(results json-key "$logs/$step.ours.jsonl" step_ms)
  mem=$(results json-key "$logs/$step.ours.jsonl" peak_device_mib 2>/dev/null || echo "?")
  mfu=$(results json-key "$logs/$step.ours.jsonl" mfu 2>/dev/null || echo "")
  reserved=$(results json-key "$logs/$step.ours.jsonl" peak_reserved_mib 2>/dev/null || echo "?")
  raw=$(results json-key "$logs/$step.ours.jsonl" raw_allocs_timed 2>/dev/null || echo "?")
  figure="ours $ours tokens/s ($ms ms/step, batch $batch${mfu:+, MFU $mfu}, peak $mem MiB, reserved $reserved MiB, $raw cudaMalloc in the timed steps)"
  figure+="; $(results profile-top "$logs/$step.ours.jsonl" 4 2>&1)"
  figure+="; $(results top-ops "$logs/$step.ours.jsonl" 4 2>&1)"
  # Note [fused attention]: the run above uses cuDNN's fused attention where it can
  # (a fallback is logged once, naming why); the same step with the packed kernels
  # shows what the fusion is worth.
  if grep -q "not cuDNN's fused attention" "$logs/$step.ours.log"; then
    figure+="; attention NOT fused ($(grep -m1 -o "fused attention: .*" "$logs/$step.ours.log" | cut -c1-160))"
  fi
  # shellcheck disable=SC2016
  if run_logged "$step.packed" 180 env DDP_CUDNN_ATTENTION=0 sh -c '"$1" gpt --device "$2" --model "$3" \
    --batch-size "$4" --precision bf16 --peak-tflops "$6" --warmup 3 --repeats 10 --json >"$5"' sh "$bin/bench" \
    "$dev" "$model" "$batch" "$logs/$step.packed.jsonl" "$peak"; then
    figure+="; packed attention $(results json-key "$logs/$step.packed.jsonl" tokens_per_s) tokens/s, peak \
$(results json-key "$logs/$step.packed.jsonl" peak_device_mib 2>/dev/null || echo "?") MiB"
  else
    figure+="; packed attention FAILED: $(why_failed "$step.packed" "$?")"
  fi
  if [[ ${4:-} == gpt:* ]]; then
    # shellcheck disable=SC2016
    if run_logged "$step.padded" 90 sh -c '"$1" gpt --device "$2" --model "$3" --batch-size "$4" \
      --precision bf16 --peak-tflops "$6" --warmup 3 --repeats 5 --json >"$5"' sh "$bin/bench" "$dev" \
      "$4" "$batch" "$logs/$step.padded.jsonl" "$peak"; then
      local columns=${4##*padded_vocab=}
      columns=${columns%%,*}
      figure+="; head padded to $columns columns $(results json-key "$logs/$step.padded.jsonl" \
tokens_per_s) tokens/s ($(results json-key "$logs/$step.padded.jsonl" step_ms) ms/step)"
    else
      figure+="; padded head FAILED: $(why_failed "$step.padded" "$?")"
    fi
  fi
  if [[ ${4:-} == graph ]]; then
    # shellcheck disable=SC2016
    if run_logged "$step.graph" 180 sh -c '"$1" gpt --device "$2" --model "$3" --batch-size "$4" \
      --precision bf16 --peak-tflops "$6" --warmup 3 --repeats 10 --cuda-graph yes --json >"$5"' sh \
      "$bin/bench" "$dev" "$model" "$batch" "$logs/$step.graph.jsonl" "$peak"; then
      graphed=$(results json-key "$logs/$step.graph.jsonl" tokens_per_s)
      figure+="; with --cuda-graph $graphed tokens/s ($(results json-key "$logs/$step.graph.jsonl" step_ms) \
ms/step)"
    else
      figure+="; --cuda-graph FAILED: $(why_failed "$step.graph" "$?")"
    fi
  fi
  if ! torch_can_run; then record "$step" "ok" "$figure" "no CUDA PyTorch for $python"; return; fi
  local form reference="" theirs tmem
  for form in strict eager; do
    # The strict run then profiles 3 steps: its kernels against our ops.
    local flags=(--strict --profile-steps 3 --profile-out "$logs/$step.torch_strict.profile.jsonl")
    [[ $form == eager ]] && flags=(--precision bf16 --sdpa --fused-adamw --tf32)
    run_logged "$step.torch_$form" 240 "$python" "$repo_root/bench/peer/torch_gpt_train.py" --model "$model" \
      --device "$dev" --batch "$batch" --steps 10 --warmup 3 --peak-tflops "$peak" "${flags[@]}"
    rc=$?
    if [[ $rc -ne 0 ]]; then
      reference+="${reference:+; }PyTorch $form FAILED: $(why_failed "$step.torch_$form" "$rc")"
      continue
    fi
    theirs=$(results json-key "$logs/$step.torch_$form.log" tokens_per_s)
    tmem=$(results json-key "$logs/$step.torch_$form.log" peak_memory_mib 2>/dev/null || echo "?")
    reference+="${reference:+; }PyTorch $form $theirs tokens/s, peak $tmem MiB (ours/PyTorch $(awk -v a="$ours" \
      -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')${graphed:+, with --cuda-graph $(awk -v a="$graphed" \
      -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')})"
    if [[ $form == strict ]]; then
      reference+=", its kernels $(results profile-top "$logs/$step.torch_strict.profile.jsonl" 4 2>&1)"
    fi
  done
  record "$step" "ok" "$figure" "$reference"
}

# bf16_loss: gpt-mini from the same seed for 300 steps on the synthetic Markov text,
# fp32 and bf16 on the device: the mean loss of the last 50 steps within 2%.
readonly kBf16LossGap=0.02
step_bf16_loss() {
  local step=bf16_loss rc line
  selected "$step" || return
  skip_cuda "$step" && return
  [[ $dev == cpu ]] && { record "$step" "skipped: bf16 autocast is for CUDA (--device cpu)"; return; }
  local args=(--model gpt-mini --data synthetic --epochs 1 --max-steps 300 --batch-size 16 --seed 3 --quiet
    --device "$dev")
  rm -f "$logs/$step.fp32.loss" "$logs/$step.bf16.loss"
  run_logged "$step.fp32" 150 "$bin/train" "${args[@]}" --loss-log "$logs/$step.fp32.loss"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: fp32: $(why_failed "$step.fp32" "$rc")"; return; fi
  run_logged "$step.bf16" 150 "$bin/train" "${args[@]}" --precision bf16 --loss-log "$logs/$step.bf16.loss"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: bf16: $(why_failed "$step.bf16" "$rc")"; return; fi
  line=$(results loss-gap "$logs/$step.fp32.loss" "$logs/$step.bf16.loss" 50 "$kBf16LossGap")
  rc=$?
  if [[ $rc -eq 0 ]]; then record "$step" "ok" "$line" "bf16 within $kBf16LossGap of fp32"; else
    record "$step" "FAILED: bf16's loss is off fp32's" "$line" "bf16 within $kBf16LossGap of fp32"; fi
}

# The bf16 forms of the DDP, ZeRO and DataParallel checks. At one rank (nccl) the
# computation is the one-process bf16 run's: its checkpoint within kCheckpointRtol. At
# two ranks (or replicas) each GEMM sees half the batch, whose bf16 activations may
# round apart, and the trajectory amplifies it: each must stay no further from the
# one-process bf16 run than twice the fp32 run is (tests/e2e/checkpoint_distance.py;
# e2e.train_autocast checks the same on CPU ranks).
distance_step() { # STEP PATTERN WHAT CMD...: CMD saves logs/STEP.safetensors
  local step=$1 pattern=$2 what=$3 rc line
  shift 3
  selected "$step" || return
  have_data "$step" || return
  skip_cuda "$step" && return
  if [[ ! -f "$logs/reference_bf16.safetensors" || ! -f "$logs/reference.safetensors" ]]; then
    record "$step" "FAILED: no reference checkpoints (see the reference and reference_bf16 steps)"
    return
  fi
  rm -f "$logs/$step.safetensors"
  run_logged "$step" 240 "$@" --save "$logs/$step.safetensors"
  rc=$?
  if [[ $rc -ne 0 ]]; then record "$step" "FAILED: $(why_failed "$step" "$rc")" "-" "$what"; return; fi
  if ! grep -qE "$pattern" "$logs/$step.log"; then
    record "$step" "FAILED: the log does not show /$pattern/" "-" "$what"
    return
  fi
  line=$("$python" "$repo_root/tests/e2e/checkpoint_distance.py" "$logs/reference_bf16.safetensors" \
    "$logs/$step.safetensors" "$logs/reference.safetensors" 2>&1)
  rc=$?
  if [[ $rc -eq 0 ]]; then record "$step" "ok" "$line" "$what"; else
    record "$step" "FAILED: further from reference_bf16 than bf16 is from fp32" "$line" "$what"; fi
}

bf16_compare_steps() {
  local compare_ref=reference_bf16
  if [[ $dev == cpu ]]; then
    local step
    for step in ddp_bf16_nccl_w1 zero2_bf16_nccl_w1 ddp_bf16_shm_w2 dp_bf16_2replicas; do
      selected "$step" && record "$step" "skipped: bf16 autocast is for CUDA (--device cpu)"
    done
    return
  fi
  compare_step ddp_bf16_nccl_w1 "ddp over 1 ranks \(nccl backend" "= reference_bf16 (one process)" \
    env DDP_BACKEND=nccl "$bin/ddprun" --standalone -n 1 "$bin/train" "${same_args[@]}" --precision bf16 \
    --mode ddp --data "$data" --device "$dev" --batch-size 64
  compare_step zero2_bf16_nccl_w1 "ddp over 1 ranks \(nccl backend" "= reference_bf16 (one process)" \
    env DDP_BACKEND=nccl "$bin/ddprun" --standalone -n 1 "$bin/train" "${same_args[@]}" --precision bf16 \
    --mode ddp --zero 2 --data "$data" --device "$dev" --batch-size 64
  distance_step ddp_bf16_shm_w2 "ddp over 2 ranks \(shm backend" "near reference_bf16 (one process, 2x batch)" \
    env DDP_BACKEND=shm "$bin/ddprun" --standalone -n 2 "$bin/train" "${same_args[@]}" --precision bf16 \
    --data "$data" --device "$dev" --batch-size 32
  distance_step dp_bf16_2replicas "dp over 2 replicas" "near reference_bf16 (one device)" \
    "$bin/train" "${same_args[@]}" --precision bf16 --mode dp --devices "$dev,$dev" --data "$data" \
    --batch-size 64
}

run_bf16_steps() {
  gpt_bf16_step gpt2_bf16 gpt2 16 "gpt:layers=12,d=768,heads=12,ctx=1024,vocab=50257,padded_vocab=50304"
  gpt_bf16_step gpt_mini_bf16 gpt-mini 16 graph
  step_bf16_loss
  if selected reference_bf16 || selected ddp_bf16_nccl_w1 || selected zero2_bf16_nccl_w1 ||
    selected ddp_bf16_shm_w2 || selected dp_bf16_2replicas; then
    # The fp32 reference too (the yardstick of the two-rank steps), unless the
    # selection runs it later anyway.
    [[ $dev != cpu && $reference_done -eq 0 ]] && step_reference
    if [[ $dev == cpu ]]; then
      record reference_bf16 "skipped: bf16 autocast is for CUDA (--device cpu)"
    else
      step_reference reference_bf16 --precision bf16
    fi
  fi
  bf16_compare_steps
}

# Note [planted faults] (runtime/planted_fault.h): each kernel's gpu tests must fail
# with a fault planted in its output (bench/gpu/planted_faults.txt). With --device
# cpu, the table's CPU column against ddp_unit_tests (what CI checks too).
step_planted_faults() {
  local step=planted_faults exe="$bin/ddp_gpu_tests" device=cuda rc figure why
  selected "$step" || return
  skip_cuda "$step" && return
  [[ $dev == cpu ]] && exe="$bin/ddp_unit_tests" device=cpu
  if [[ ! -x "$exe" ]]; then
    record "$step" "$([[ $with_tests -eq 0 ]] && echo "skipped: --no-tests" || echo "FAILED: $exe is missing")"
    return
  fi
  if [[ $optional == *",$step,"* && $budget -gt 0 && $(remaining) -lt 120 ]]; then
    record "$step" "skipped: --quick runs it with 120 s of the --budget left, $(remaining) s were"
    return
  fi
  # Its own budget stops it before run_logged's limit would (the lines left: "not run").
  local limit=240
  [[ $budget -gt 0 && $(remaining) -lt $limit ]] && limit=$(remaining)
  # --emulated: the table's library lines (cuBLASLt, cuDNN) are left out, and a run of
  # the kernels' tests on the CPU takes longer than on a GPU.
  local emulation=()
  [[ $emulated -eq 1 ]] && emulation=(--emulated)
  run_logged "$step" "$limit" "$here/planted_faults.sh" --tests "$exe" --device "$device" \
    --timeout $((emulated ? 90 : 60)) ${emulation[@]+"${emulation[@]}"} --budget $((limit > 20 ? limit - 15 : 5)) \
    --log "$logs/planted_faults.runs.log"
  rc=$?
  figure=$(grep '^planted faults on' "$logs/$step.log" | tail -1)
  if [[ $rc -eq 0 ]]; then
    record "$step" "ok" "${figure:-?}" "every fault caught by its tests"
  elif [[ $rc -eq 3 ]]; then
    record "$step" "partly run: the --budget ran out; every fault that ran was caught" "${figure:-?}" \
      "every fault caught by its tests"
  else
    why=$(grep -E '^(NOT CAUGHT|not reached)' "$logs/$step.log" | awk '{print $3}' |
      head -4 | tr '\n' ' ')
    [[ -z "$why" ]] && why="$(why_failed "$step" "$rc") "
    record "$step" "FAILED: ${why}(logs/$step.log, logs/planted_faults.runs.log)" "${figure:-?}" \
      "every fault caught by its tests"
  fi
}

# compute-sanitizer (the CUDA toolkit's checker) on the hand-written kernels' gpu tests:
# memcheck (out-of-bounds and misaligned device accesses), racecheck (shared-memory
# races) and synccheck (barriers in divergent code). What the emulated device cannot
# see (Note [emulated CUDA device]: a block's threads run in order, __shared__ keeps the
# last block's values, a stray host pointer reads fine), a GPU's own checker does.
# Each tool runs under its own share of the time; one that runs out is "partly run",
# not a failure. A sanitizer that refuses the device (gVisor) is "skipped", named.
# With --device cpu, the same commands around ddp_unit_tests' CPU ops (a test of this
# step's logic: COMPUTE_SANITIZER names a stand-in).
readonly kSanitizerMemcheck='GpuOps.*:NnOpsGpu.*:TransformerOpsGpu.*:MultiTensorGpu.*:VecMapGpu.*:MixedPrecisionGpu.*'
readonly kSanitizerShared='GpuOps.*:TransformerOpsGpu.*:MultiTensorGpu.*:MixedPrecisionGpu.FusedClassifier*'
find_compute_sanitizer() {
  local c
  for c in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
    "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n "$c" && -x "$c" ]] && { echo "$c"; return 0; }
  done
  return 1
}
step_kernel_sanitizer() {
  local step=kernel_sanitizer exe="$bin/ddp_gpu_tests" sanitizer tool filter no_caching rc errors report
  local ran=() partly=() found=() share
  selected "$step" || return
  skip_cuda "$step" && return
  if [[ $emulated -eq 1 ]]; then
    record "$step" "skipped: compute-sanitizer checks a GPU's kernels; the emulated device runs them on the CPU"
    return
  fi
  local memcheck_filter=$kSanitizerMemcheck shared_filter=$kSanitizerShared
  if [[ $dev == cpu ]]; then
    exe="$bin/ddp_unit_tests" memcheck_filter='TransformerOps.Gelu*' shared_filter='TransformerOps.LayerNorm*'
  fi
  if [[ ! -x "$exe" ]]; then
    record "$step" "$([[ $with_tests -eq 0 ]] && echo "skipped: --no-tests" || echo "FAILED: $exe is missing")"
    return
  fi
  if ! sanitizer=$(find_compute_sanitizer); then
    record "$step" "skipped: no compute-sanitizer (searched \$COMPUTE_SANITIZER, PATH, \$CUDA_HOME/bin, /usr/local/cuda)" "-" "0 errors"
    return
  fi
  if [[ $optional == *",$step,"* && $budget -gt 0 && $(remaining) -lt 150 ]]; then
    record "$step" "skipped: --quick runs it with 150 s of the --budget left, $(remaining) s were"
    return
  fi
  share=100
  [[ $budget -gt 0 && $(( ($(remaining) - 10) / 3 )) -lt $share ]] && share=$(( ($(remaining) - 10) / 3 ))
  [[ $share -lt 10 ]] && share=10
  for tool in memcheck racecheck synccheck; do
    filter=$shared_filter no_caching=0
    # memcheck sees a read past a tensor only where its cudaMalloc ends there: every
    # tensor its own exact allocation (Note [no caching] in memory/caching_allocator.h).
    [[ $tool == memcheck ]] && filter=$memcheck_filter no_caching=1
    # API errors are left out: some tests provoke them on purpose (a device that does
    # not exist), and the tests check what the library says about them.
    run_logged "$step.$tool" "$share" env DDP_NO_CUDA_MEMORY_CACHING=$no_caching "$sanitizer" --tool "$tool" \
      --error-exitcode 86 --print-limit 20 --report-api-errors no "$exe" --gtest_filter="$filter" --gtest_color=no
    rc=$?
    # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
    errors=$(sed -n -e 's/^========= ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' \
      -e 's/^========= RACECHECK SUMMARY: .*(\([0-9][0-9]*\) errors\{0,1\},.*/\1/p' \
      "$logs/$step.$tool.log" | tail -1)
    # Its first report: the first "=========" line that is not the banner or a summary.
    report=$(grep -E '^========= [^ ]' "$logs/$step.$tool.log" | grep -v -E 'COMPUTE-SANITIZER|SUMMARY' |
      head -1 | sed 's/^========= //' | cut -c1-120 | tr '|\t' '/ ')
    if grep -q -E '^========= (Error: )?(Device not supported|Unable to find injection library)' \
      "$logs/$step.$tool.log"; then
      record "$step" "skipped: compute-sanitizer cannot instrument this device or runtime: ${report} (logs/$step.$tool.log)" \
        "-" "0 errors"
      return
    fi
    if [[ $rc -eq 125 ]]; then
      found+=("$tool: $(why_failed "$step.$tool" "$rc")")
    elif [[ $rc -eq 86 || ${errors:-0} -gt 0 || (-n "$report" && -z "$errors") ]]; then
      # (A report before a timeout counts: the run ended before its summary.)
      found+=("$tool ${errors:-?} error(s): ${report:-see the log}")
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
      partly+=("$tool")
    elif [[ $rc -ne 0 ]]; then
      found+=("$tool: $(why_failed "$step.$tool" "$rc")")
    elif [[ -z "$errors" ]]; then
      found+=("$tool: no ERROR SUMMARY line (logs/$step.$tool.log)")
    else
      ran+=("$tool")
    fi
  done
  local figure="0 errors from ${ran[*]:-none}${partly[*]:+; out of time: ${partly[*]}}"
  if [[ ${#found[@]} -gt 0 ]]; then
    record "$step" "FAILED: ${found[*]} (logs/$step.*.log)" "$figure" "0 errors"
  elif [[ ${#partly[@]} -gt 0 ]]; then
    record "$step" "partly run: its share of the --budget ran out; no error found" "$figure" "0 errors"
  else
    record "$step" "ok" "$figure" "0 errors"
  fi
}

# run_steps: every step after the preflight, in order (--only picks some).
run_steps() {
  selected gpu_tests && step_gpu_tests
  # bf16 first (issue 29): they are what a lent GPU is for now; --budget cuts the tail.
  run_bf16_steps
  # Issue 29's CUDA graphs: replays equal to eager steps, and what they save.
  graph_step graph_mlp 400 --model mlp --data "$data" --epochs 1 --seed 3 --quiet
  graph_step graph_cnn 200 --model cnn --data "$data" --epochs 1 --seed 3 --quiet
  graph_step graph_gpt 150 --model gpt-mini --data synthetic --precision bf16 --batch-size 16 --epochs 1 \
    --seed 3 --quiet
  train_step train_mlp mlp 3 "$kMlpCpuAcc"
  train_step train_cnn cnn 1 "$kCnnCpuAcc"
  parity_step parity_mlp mlp 50
  parity_step parity_cnn cnn 15
  if selected reference || selected ddp_nccl_w1 || selected elastic_nccl_w1 ||
    selected ddp_shm_w2 || selected dp_2replicas || selected zero2_nccl_w1 ||
    selected zero1_shm_w2 || selected zero2_shm_w2; then
    [[ $reference_done -eq 0 ]] && step_reference
  fi
  if [[ $dev == cpu ]] && selected ddp_nccl_w1; then
    record ddp_nccl_w1 "skipped: nccl needs CUDA (--device cpu)"
  else
    compare_step ddp_nccl_w1 "ddp over 1 ranks \(nccl backend" "= reference (one process)" \
      env DDP_BACKEND=nccl "$bin/ddprun" --standalone -n 1 "$bin/train" "${same_args[@]}" --mode ddp \
      --data "$data" --device "$dev" --batch-size 64
  fi
  # Issue 32 (Note [nccl regroup]): nccl under --on-failure continue, no failure --
  # its communicator checks the membership while collectives are in flight.
  if [[ $dev == cpu ]] && selected elastic_nccl_w1; then
    record elastic_nccl_w1 "skipped: nccl needs CUDA (--device cpu)"
  else
    compare_step elastic_nccl_w1 "ddp over 1 ranks \(nccl backend" "= reference (one process)" \
      env DDP_BACKEND=nccl "$bin/ddprun" --standalone -n 1 --on-failure continue "$bin/train" \
      "${same_args[@]}" --mode ddp --data "$data" --device "$dev" --batch-size 64
  fi
  compare_step ddp_shm_w2 "ddp over 2 ranks \(shm backend" "= reference (one process, 2x batch)" \
    env DDP_BACKEND=shm "$bin/ddprun" --standalone -n 2 "$bin/train" "${same_args[@]}" \
    --data "$data" --device "$dev" --batch-size 32
  compare_step dp_2replicas "dp over 2 replicas" "= reference (one device)" \
    "$bin/train" "${same_args[@]}" --mode dp --devices "$dev,$dev" --data "$data" --batch-size 64
  # ZeRO (issue 19): the nccl reduce_scatter at one rank, and the shard all_gather /
  # reduce_scatter of device tensors through shm's host staging at two ranks.
  if [[ $dev == cpu ]] && selected zero2_nccl_w1; then
    record zero2_nccl_w1 "skipped: nccl needs CUDA (--device cpu)"
  else
    compare_step zero2_nccl_w1 "ddp over 1 ranks \(nccl backend" "= reference (one process)" \
      env DDP_BACKEND=nccl "$bin/ddprun" --standalone -n 1 "$bin/train" "${same_args[@]}" --mode ddp --zero 2 \
      --data "$data" --device "$dev" --batch-size 64
  fi
  compare_step zero1_shm_w2 "ddp over 2 ranks \(shm backend" "= reference (one process, 2x batch)" \
    env DDP_BACKEND=shm "$bin/ddprun" --standalone -n 2 "$bin/train" "${same_args[@]}" --zero 1 \
    --data "$data" --device "$dev" --batch-size 32
  compare_step zero2_shm_w2 "ddp over 2 ranks \(shm backend" "= reference (one process, 2x batch)" \
    env DDP_BACKEND=shm "$bin/ddprun" --standalone -n 2 "$bin/train" "${same_args[@]}" --zero 2 \
    --data "$data" --device "$dev" --batch-size 32
  step_parity_gpt
  step_ddp_gpt
  step_bench device
  step_planted_faults
  step_kernel_sanitizer
  step_bench gemm
  torch_step torch_mlp mlp
  torch_step torch_cnn cnn
  gpt_speed_step gpt_mini gpt-mini 16
  gpt_speed_step gpt2 gpt2 4
}
