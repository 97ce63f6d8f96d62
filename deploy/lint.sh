#!/usr/bin/env bash
# Checks what can be checked of deploy/ without a cluster or Docker:
#
#   deploy/lint.sh [DDPRUN]
#
#  - shellcheck on the shell scripts (deploy/, the Slurm batch scripts, the
#    packaging tests, the GPU machine's scripts bench/gpu/);
#  - the Kubernetes manifests parse and agree with themselves
#    (deploy/check_manifests.py), and with DDPRUN given, use only flags that
#    `DDPRUN --help` lists;
#  - the Dockerfiles: every COPY source exists, every -DDDP_* option is one the
#    CMake project defines, and the image's entrypoint is ddprun.
# `docker build` itself cannot run here (no Docker daemon); see docs/deploy.md.
# Exits 77 (skipped), saying why, when shellcheck or Python's yaml is missing.
set -uo pipefail
usage_error() {
  echo "deploy/lint.sh: $*" >&2
  echo "usage: deploy/lint.sh [DDPRUN] (see --help)" >&2
  exit 2
}
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  -*) usage_error "unknown option '$1'" ;;
esac
if [ $# -gt 1 ]; then usage_error "expected at most 1 argument, got $#"; fi
cd "$(dirname "$0")/.." || exit 1
ddprun=${1:-}
fail() { echo "deploy/lint.sh: FAIL: $*" >&2; exit 1; }

command -v shellcheck >/dev/null ||
  { echo "deploy/lint.sh: SKIP: shellcheck is not installed (apt-get install shellcheck)"; exit 77; }
python=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import yaml' 2>/dev/null; then python=$p; break; fi
done
[ -n "$python" ] ||
  { echo "deploy/lint.sh: SKIP: no python3 with the yaml module (apt-get install python3-yaml)"; exit 77; }

scripts=(deploy/*.sh deploy/slurm/*.sbatch tests/e2e/install_package.sh tests/e2e/bundle.sh bench/gpu/*.sh)
shellcheck -x "${scripts[@]}" || fail "shellcheck"
echo "deploy/lint.sh: shellcheck: ${#scripts[@]} scripts clean"

help_file=""
if [ -n "$ddprun" ]; then
  help_file=$(mktemp)
  trap 'rm -f "$help_file"' EXIT
  "$ddprun" --help >"$help_file" 2>&1 || fail "$ddprun --help"
fi
"$python" deploy/check_manifests.py deploy/k8s ${help_file:+"$help_file"} || fail "Kubernetes manifests"

options=$(cat CMakeLists.txt cmake/*.cmake)
for dockerfile in deploy/docker/Dockerfile.*; do
  grep -q '^FROM ' "$dockerfile" || fail "$dockerfile has no FROM"
  grep -q '^ENTRYPOINT \["ddprun"\]' "$dockerfile" || fail "$dockerfile: the entrypoint is not ddprun"
  while read -r src; do
    [ -e "$src" ] || fail "$dockerfile copies $src, which does not exist"
  done < <(sed -nE 's/^COPY +([^-][^ ]*) +[^ ]+$/\1/p' "$dockerfile")
  while read -r option; do
    grep -qE "(set|option)\(${option#-D}\b" <<<"$options" ||
      fail "$dockerfile sets ${option#-D}, which the CMake project does not define"
  done < <(grep -oE -- '-DDDP_[A-Z_]+' "$dockerfile" | sort -u)
  echo "deploy/lint.sh: $dockerfile: ok (not built: no Docker here)"
done
echo "deploy/lint.sh: ok"
