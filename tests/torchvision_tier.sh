#!/usr/bin/env bash
# The torchvision tier (docs/torchvision.md). torchvision 0.29.1 needs torch 2.14.1, which the
# main environment's torch 2.13.0 CPU wheel cannot be, so the tier has its own virtual
# environment, .venv-tv (gitignored). It is created on the first run (torch 2.14.1 and
# torchvision 0.29.1 from the local index, about 5.5 GB, timm 1.0.31 for the timm sweep's sample,
# then this project in editable mode)
# and reused afterwards; a .venv-tv whose torch2jax is not this checkout is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

here="$(pwd -P)"
ready() {
    [ -x .venv-tv/bin/python ] && .venv-tv/bin/python - "$here" <<'PY' 2>/dev/null
import os, sys
import timm  # noqa: F401
import torchvision  # noqa: F401
import torch2jax
sys.exit(not os.path.realpath(torch2jax.__file__).startswith(sys.argv[1] + os.sep))
PY
}

if ! ready; then
    rm -rf .venv-tv
    python3 -m venv .venv-tv
    .venv-tv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm==1.0.31
    .venv-tv/bin/pip install -e '.[test]'
    ready || { echo "torchvision tier: .venv-tv cannot import torchvision, timm and this torch2jax" >&2; exit 1; }
fi

exec .venv-tv/bin/python -m pytest -q -m torchvision tests/test_torchvision.py \
    tests/test_torchvision_transforms.py tests/test_torchvision_user.py tests/test_timm_sweep.py \
    tests/test_timm_sweep_limits.py "$@"
