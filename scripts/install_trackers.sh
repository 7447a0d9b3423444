#!/usr/bin/env bash
# Install the experiment-tracker libraries into .venv, one at a time, so one that fails to install
# (no wheel for this Python, a resolver conflict) does not stop the others. torch stays pinned: a
# tracker that asks for another torch is refused by the constraint and reported as failed.
# Usage: bash scripts/install_trackers.sh [library ...]    (default: every tracker extra)
set -uo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
[ -x "$python" ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }
known=(tensorboard wandb mlflow aim dvclive clearml comet-ml swanlab trackio)
libraries=("$@")
[ ${#libraries[@]} -gt 0 ] || libraries=("${known[@]}")
for library in "${libraries[@]}"; do
  # pip only warns about an unknown extra and installs nothing, so check the names here.
  [[ " ${known[*]} " == *" $library "* ]] || { echo "unknown tracker extra '$library'; choose from: ${known[*]}" >&2; exit 2; }
done
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$constraints"
failed=()
for library in "${libraries[@]}"; do
  start=$(date +%s)
  if "$python" -m pip install -q --disable-pip-version-check -c "$constraints" -e ".[$library]"; then
    echo "installed $library in $(( $(date +%s) - start ))s"
  else
    echo "FAILED to install $library (tests for it will be skipped)" >&2
    failed+=("$library")
  fi
done
[ ${#failed[@]} -eq 0 ] || echo "not installed: ${failed[*]}" >&2
exit 0
