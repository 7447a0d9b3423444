#!/usr/bin/env bash
# Create .venv with torch pinned to the local CPU wheel, then hasten (editable) with the extras asked for.
# Usage: bash scripts/setup.sh            # hasten only
#        bash scripts/setup.sh test       # + test tools
#        bash scripts/setup.sh test,bench # + several extras
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first and exactly pinned: an open range would pull gigabytes of CUDA wheels.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
if [ -n "$extras" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]"
else
  .venv/bin/pip install -q --disable-pip-version-check -e .
fi
