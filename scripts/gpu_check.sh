#!/usr/bin/env bash
# The GPU suite in one command: every case of tests/gpu/, in the plan's order (most valuable first), each inside its
# bound, results written as each case ends, then a pass/fail table and the figures.
#   bash scripts/gpu_check.sh                      # on the GPU machine, with .whl/ carried (scripts/gpu_wheels.sh here)
#   bash scripts/gpu_check.sh --cases ID ...       # a rerun of some cases (node ids as the table or --dry-run prints)
#   bash scripts/gpu_check.sh --dry-run [--cases]  # anywhere, any python3: the cases, each one's estimate and bound,
#                                                  # the totals against the device's window, the carried wheels
# The plan and the budget: scripts/gpu_plan.py (the run stops at 480 s; a session has 900 s with the machine's start).
# Logs and results: OUT (default: a new temporary folder): results.jsonl (a line per case start and end, written as
# it happens), pytest.log, figures.jsonl. Exit status: 0 when every case passed or skipped; 1 when one failed or was
# stopped; 3 when the carried wheels are missing or do not install (before any case runs).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"   # the GPU image has python3, not python
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

if [ "${1:-}" = "--dry-run" ]; then
    shift
    exec "$PYTHON" scripts/gpu_plan.py "$@"
fi

OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export HASTEN_GPU_FIGURES="$OUT/figures.jsonl"
: > "$HASTEN_GPU_FIGURES"
: > "$OUT/results.jsonl"
echo "gpu_check: results in $OUT"

# The carried wheels (scripts/gpu_wheels.sh), installed with no index (the machine reaches none). A missing or
# broken wheel stops here, loudly: the cases that need it would only skip.
"$PYTHON" scripts/gpu_plan.py --check-wheels || exit 3
timeout 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/hasten-site .whl/*.whl || { echo "gpu_check: installing the carried wheels failed (above)"; exit 3; }
export PYTHONPATH="$PYTHONPATH:/tmp/hasten-site"

"$PYTHON" - <<'PY' || exit 3
import importlib, sys, torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPUs:",
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or "none")
print("optional:", {name: importlib.util.find_spec(name) is not None
                    for name in ("bitsandbytes", "transformer_engine", "accelerate")})
for carried in ("torchao", "deepspeed"):  # carried: they must import, or their cases would only skip
    try:
        module = importlib.import_module(carried)
    except Exception as error:
        sys.exit(f"gpu_check: the carried {carried} does not import: {type(error).__name__}: {error}")
    print(carried, getattr(module, "__version__", "?"))
PY

timeout 540 "$PYTHON" scripts/gpu_run.py --out "$OUT" "$@"
status=$?
[ $status -eq 124 ] && echo "gpu_check: stopped at the 540 s limit; the results reached are in $OUT/results.jsonl"
exit $status
