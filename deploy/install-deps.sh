#!/usr/bin/env bash
# Installs every Debian package that ddp's build, tests, benchmarks and the
# default data set need. Idempotent: packages already present are skipped, and
# nothing is downloaded when everything is installed. Uses sudo when not root.
#
#   deploy/install-deps.sh            build + tests + data set
#   deploy/install-deps.sh --with-peer  also python3-torch (the benchmark peer)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format
  iproute2 python3
  libgtest-dev libgmock-dev googletest
  libspdlog-dev libfmt-dev
  libopenblas-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev
  zlib1g-dev
  patchelf shellcheck python3-yaml
  dataset-fashion-mnist
)
for arg in "$@"; do
  case "$arg" in
    --with-peer) packages+=(python3-torch python3-numpy) ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg' (valid: --with-peer, --help)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install as root: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
