#!/usr/bin/env bash
# The GPU suite in one command: every CUDA-specific test (tests/gpu/), a pass/fail table, and the figures.
#   bash scripts/gpu_check.sh [extra pytest args]   # on the GPU machine (after scripts/gpu_wheels.sh here)
#   bash scripts/gpu_check.sh --dry-run             # anywhere: the planned cases and a time estimate for each
# Budget: the device lends 10 minutes a command and 15 a session; pytest gets at most GPU_CHECK_TIMEOUT (420 s)
# and the whole script ends within 7 minutes on one H100, leaving time for a rerun in the same window.
# Exit status: pytest's (124 on the timeout). Paste the printed table into docs/gpu_validation.md with the date
# and the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"   # the GPU image has python3, not python
INNER_TIMEOUT="${GPU_CHECK_TIMEOUT:-420}"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

if [ "${1:-}" = "--dry-run" ]; then
    shift
    exec "$PYTHON" scripts/gpu_plan.py --budget "$INNER_TIMEOUT" "$@"
fi

OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export HASTEN_GPU_FIGURES="$OUT/figures.jsonl"
: > "$HASTEN_GPU_FIGURES"

# The carried wheels (scripts/gpu_wheels.sh), installed without an index: the machine reaches none.
if compgen -G ".whl/*.whl" > /dev/null; then
    timeout 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/hasten-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/hasten-site" \
        || echo "gpu_check: installing the carried wheels failed; their cases will skip"
else
    echo "gpu_check: no .whl/ (run scripts/gpu_wheels.sh first): deepspeed and torchao cases will skip"
fi

"$PYTHON" - <<'PY'
import importlib.util, torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPUs:",
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or "none")
print("optional:", {name: importlib.util.find_spec(name) is not None
                    for name in ("deepspeed", "torchao", "bitsandbytes", "transformer_engine", "accelerate")})
PY

timeout "$INNER_TIMEOUT" "$PYTHON" -m pytest -q -p no:cacheprovider tests/gpu -rA --junitxml="$OUT/gpu.xml" -s "$@" \
    > "$OUT/pytest.log" 2>&1
status=$?
[ $status -eq 124 ] && echo "gpu_check: pytest stopped at the ${INNER_TIMEOUT}s limit"
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
