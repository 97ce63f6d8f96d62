#!/usr/bin/env bash
# Builds ddp with CUDA on a GPU machine, runs the gpu tests and the GPU
# benchmarks, and prints a short summary table last. See --help.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/gpu/run.sh [options]

On a machine with an NVIDIA GPU: configures a CUDA build (sm_90) into build-gpu,
builds it, runs `ctest -L gpu --output-on-failure`, then `bench device` and
`bench gemm`, each as a table and as JSON lines, and prints a summary last.

Results go to $OUT when it is set, else to <build dir>/bench-results:
  ctest.log, bench_device.txt, bench_device.jsonl, bench_gemm.txt,
  bench_gemm.jsonl, summary.txt

options:
  --build-dir DIR   build folder (default: build-gpu in the repository root)
  --arch LIST       CMAKE_CUDA_ARCHITECTURES (default: 90)
  --prefix DIR      where missing dependencies were unpacked (spdlog, fmt, GoogleTest,
                    OpenBLAS, ...): added to CMAKE_PREFIX_PATH; may be repeated
  --device DEV      device for the benchmarks (default: cuda:0)
  --no-tests        configure without tests (no GoogleTest on this machine) and skip ctest
  --jobs N          build jobs (default: number of cores)
  -h, --help        this help

Exit code: 0 when the build, the gpu tests and both benchmarks succeeded,
1 when any of them failed (the later steps still run after a failed test).
EOF
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${repo_root}/build-gpu"
arch="90"
device="cuda:0"
prefixes=()
with_tests=1
jobs="$(nproc 2>/dev/null || echo 4)"

need_value() {
  if [[ $# -lt 2 || -z "$2" ]]; then echo "run.sh: $1 needs a value (see --help)" >&2; exit 2; fi
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) need_value "$@"; build_dir="$2"; shift 2 ;;
    --arch) need_value "$@"; arch="$2"; shift 2 ;;
    --prefix) need_value "$@"; prefixes+=("$2"); shift 2 ;;
    --device) need_value "$@"; device="$2"; shift 2 ;;
    --no-tests) with_tests=0; shift ;;
    --jobs) need_value "$@"; jobs="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option '$1'; valid: --build-dir, --arch, --prefix, --device," \
            "--no-tests, --jobs, --help" >&2; exit 2 ;;
  esac
done

results="${OUT:-${build_dir}/bench-results}"
mkdir -p "${results}"
log() { echo "== run.sh: $*" >&2; }

# ---- configure and build ----------------------------------------------------
cmake_args=(-S "${repo_root}" -B "${build_dir}" -DDDP_CUDA=ON
            -DCMAKE_CUDA_ARCHITECTURES="${arch}" -DCMAKE_BUILD_TYPE=Release)
if command -v ninja >/dev/null 2>&1; then cmake_args+=(-G Ninja); fi
if [[ ${with_tests} -eq 0 ]]; then cmake_args+=(-DDDP_BUILD_TESTS=OFF); fi
if [[ ${#prefixes[@]} -gt 0 ]]; then
  prefix_path="$(IFS=';'; echo "${prefixes[*]}")"
  cmake_args+=(-DCMAKE_PREFIX_PATH="${prefix_path}")
fi
log "configuring into ${build_dir} (CUDA architectures ${arch})"
cmake "${cmake_args[@]}"
log "building with ${jobs} jobs"
cmake --build "${build_dir}" -j "${jobs}"

# ---- tests and benchmarks: record failures, keep going ------------------------
tests_status="skipped (--no-tests)"
failed=0
if [[ ${with_tests} -eq 1 ]]; then
  log "ctest -L gpu"
  if ctest --test-dir "${build_dir}" -L gpu --output-on-failure 2>&1 |
     tee "${results}/ctest.log"; then
    tests_status="passed"
  else
    tests_status="FAILED (see ${results}/ctest.log)"
    failed=1
  fi
fi

bench="${build_dir}/bin/bench"
declare -A bench_status
for sub in device gemm; do
  log "bench ${sub} --device ${device}"
  if "${bench}" "${sub}" --device "${device}" | tee "${results}/bench_${sub}.txt" &&
     "${bench}" "${sub}" --device "${device}" --json > "${results}/bench_${sub}.jsonl"; then
    bench_status[${sub}]="ok"
  else
    bench_status[${sub}]="FAILED"
    failed=1
  fi
done

# ---- summary ----------------------------------------------------------------
summarize() {
  python3 - "${results}" <<'PY'
import json, os, sys
results = sys.argv[1]

def rows(name):
    path = os.path.join(results, f"bench_{name}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]

def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"

lines = []
device = rows("device")
for r in device:
    if r.get("section") == "setup":
        lines.append(("device", f"{r.get('device')} {r.get('name', '')}"))
    if r.get("section") == "rand" and "speedup" in r:
        lines.append(("rand 10000^2 on device vs host+copy",
                      f"{fmt(r['ms_median'], 2)} ms, {fmt(r['speedup'])}x faster"))
    if r.get("section") == "host-device bandwidth" and r.get("bytes") == 256 << 20:
        lines.append((f"{r['direction']} 256 MiB {r['host_memory']}", f"{fmt(r['gb_per_s'])} GB/s"))
    if r.get("section") == "allocate+free pair" and "speedup_vs_raw" in r:
        lines.append((f"alloc+free {r['size']} cached", f"{fmt(r['us_median'], 2)} us, "
                      f"{fmt(r['speedup_vs_raw'])}x faster than raw"))
for r in rows("gemm"):
    if r.get("section") != "gflops":
        continue
    text = f"{fmt(r.get('ours_gflops'))} GFLOP/s"
    if r.get("bare_gflops") is not None:
        text += f" (bare {fmt(r['bare_gflops'])}, overhead {fmt(r['overhead_pct'])}%)"
    lines.append((f"gemm {r['gemm']} {r['dtype']} {r['shape']}", text))
width = max((len(k) for k, _ in lines), default=0)
for k, v in lines:
    print(f"{k:<{width}}  {v}")
PY
}

{
  echo
  echo "== summary =="
  echo "build: ${build_dir} (sm_${arch})"
  echo "gpu tests: ${tests_status}"
  echo "bench device: ${bench_status[device]}   bench gemm: ${bench_status[gemm]}"
  echo "results: ${results}"
  if command -v python3 >/dev/null 2>&1; then
    summarize || echo "(the summary could not be made; see the JSON files)"
  else
    echo "(python3 not found: no summary of the JSON files)"
  fi
} | tee "${results}/summary.txt"
exit "${failed}"
