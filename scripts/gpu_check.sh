#!/usr/bin/env bash
# The GPU suite in one command: every CUDA-specific test (tests/gpu/), a pass/fail table, and the figures.
#   bash scripts/gpu_check.sh [extra pytest args]
# Runs in <= 10 minutes on one GPU (two-GPU cases skip on one). Exit status: pytest's.
# Paste the printed table into docs/gpu_validation.md with the date and the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export HASTEN_GPU_FIGURES="$OUT/figures.jsonl"
: > "$HASTEN_GPU_FIGURES"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$PYTHON" - <<'PY'
import torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPUs:",
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or "none")
PY

timeout 600 "$PYTHON" -m pytest -q -p no:cacheprovider tests/gpu -rA --junitxml="$OUT/gpu.xml" -s "$@" \
    > "$OUT/pytest.log" 2>&1
status=$?
tail -n 40 "$OUT/pytest.log"

"$PYTHON" - "$OUT/gpu.xml" "$HASTEN_GPU_FIGURES" <<'PY'
import json, sys, xml.etree.ElementTree as ET
try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except (OSError, ET.ParseError) as error:
    sys.exit(f"no junit report ({error}): pytest did not finish (timeout?)")
print("\n| test | result | time (s) |\n| --- | --- | --- |")
for case in cases:
    outcome = "PASS"
    for tag, word in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "skip")):
        found = case.find(tag)
        if found is not None:
            outcome = word + (f": {found.get('message', '')[:80]}" if word == "skip" else "")
    name = case.get("classname", "").split(".")[-1] + "::" + case.get("name", "")
    print(f"| {name} | {outcome} | {float(case.get('time', 0)):.1f} |")
figures = [json.loads(line) for line in open(sys.argv[2]) if line.strip()]
if figures:
    print("\n| figure | value | detail |\n| --- | --- | --- |")
    for f in figures:
        print(f"| {f['name']} | {f['value']} {f['unit']} | {f['note']} |")
PY
exit $status
