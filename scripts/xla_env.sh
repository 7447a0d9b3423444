#!/usr/bin/env bash
# Build (or reuse) the side environment tests/xla/ runs in: torch 2.9.0 + torch_xla 2.9.0 (torch_xla is built
# against exactly that torch) plus hasten's base dependencies and pytest. It lives outside the clone
# (${HASTEN_XLA_VENV:-$HOME/.cache/hasten/xla-venv}) so CI and later runs reuse it; the main .venv never sees
# torch_xla. hasten itself is not installed there: tests/xla/ puts src/ on PYTHONPATH.
# Prints the venv's python on success; on failure one line on stderr and a non-zero exit.
set -uo pipefail
VENV="${HASTEN_XLA_VENV:-$HOME/.cache/hasten/xla-venv}"
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c "import torch_xla, safetensors, yaml, psutil, pytest, numpy, packaging" 2>/dev/null; then
  echo "$PY"; exit 0
fi
start=$(date +%s)
log="$(mktemp -t hasten-xla-env.XXXXXX)"
fail() { echo "XLA side environment not installed ($1; log: $log)" >&2; exit 1; }
python3 -m venv "$VENV" >>"$log" 2>&1 || fail "python3 -m venv $VENV failed"
"$PY" -m pip install -q --disable-pip-version-check "torch==2.9.0" "torch_xla==2.9.0" >>"$log" 2>&1 \
  || fail "pip install torch==2.9.0 torch_xla==2.9.0 failed"
"$PY" -m pip install -q --disable-pip-version-check "numpy>=1.17" "packaging>=20" psutil pyyaml \
  "safetensors>=0.4.3" "pytest>=7" pytest-timeout >>"$log" 2>&1 || fail "pip install of hasten's dependencies failed"
"$PY" -c "import torch_xla" >>"$log" 2>&1 || fail "torch_xla does not import"
echo "XLA side environment built in $(( $(date +%s) - start )) s at $VENV" >&2
echo "$PY"
