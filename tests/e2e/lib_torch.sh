# Sourced by the e2e tests that run Debian's PyTorch: sets $python (PYTHON, else
# /usr/bin/python3, not a python that PATH may put first) and exits 77 (ctest:
# skipped) with the reason when it cannot import torch. The test command installs
# python3-torch, so on a machine set up by it this never skips.
# shellcheck shell=bash
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch.distributed' >/dev/null 2>&1; then
  echo "SKIPPED: $python cannot import torch (apt-get install python3-torch)"
  exit 77
fi
