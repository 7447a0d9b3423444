"""The GPU run's plan and runner (issue 30 item 5, issue 41 items 2-3): `bash scripts/gpu_check.sh --dry-run` works
on a bare python3 (standard library only), lists exactly the cases pytest collects, each with its bound, and fits the
device's window; a missing carried wheel fails loudly before anything runs; a stuck case costs its bound, the cases
after it still run, and every result reached is on disk."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from gpu_suite import CUDA
from launching import REPO

ci_only = pytest.mark.skipif(CUDA, reason="plans the GPU run: CI only")
NEEDED = ["torchao-0.18.0-cp310-abi3-manylinux_2_28_x86_64.whl", "deepspeed-0.19.8-py3-none-any.whl",
          "hjson-3.1.0-py3-none-any.whl", "pydantic-2.14.4-py3-none-any.whl",
          "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl", "annotated_types-0.8.0-py3-none-any.whl",
          "typing_inspection-0.4.5-py3-none-any.whl"]


def _wheels(folder, names=NEEDED):
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def _bare(*args, **kwargs):
    """The planner under a python with no site-packages (`-S`: no torch, no pytest), as a bare python3 is."""
    env = {**os.environ, "PYTHON": f"{sys.executable} -S"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", "-c", '$PYTHON scripts/gpu_plan.py "$@"', "plan", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, **kwargs)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _runner():
    spec = importlib.util.spec_from_file_location("gpu_run", REPO / "scripts" / "gpu_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@ci_only
def test_the_plan_is_what_pytest_collects_and_fits(tmp_path):
    result = _bare("--wheels", str(_wheels(tmp_path / "whl")))
    assert result.returncode == 0, result.stdout + result.stderr
    planned = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("tests/gpu/")]
    bounds = [int(re.search(r"(\d+) s\s+(\d+) s", line).group(2)) for line in result.stdout.splitlines()
              if line.startswith("tests/gpu/")]
    assert bounds and max(bounds) <= 90
    total = re.search(r"(\d+) cases; estimated run (\d+) s, (\d+) s with one case stuck to its bound, of the run's "
                      r"(\d+) s", result.stdout)
    assert total and int(total.group(1)) == len(planned) and int(total.group(3)) <= int(total.group(4)), result.stdout
    assert "room for a rerun of the failed cases" in result.stdout
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "tests/gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    ids = [line.strip() for line in collected.stdout.splitlines() if "::" in line]
    assert sorted(planned) == sorted(ids), (set(planned) ^ set(ids))
    assert planned[0] == "tests/gpu/test_nccl.py::test_world_1_is_a_real_group_with_control_plane_and_fsdp_prepare"


@ci_only
def test_a_missing_or_doubled_wheel_fails_loudly_before_anything_runs(tmp_path):
    folder = _wheels(tmp_path / "whl", [n for n in NEEDED if not n.startswith("deepspeed")])
    result = _bare("--wheels", str(folder))
    assert result.returncode == 1 and "no deepspeed wheel (needed by the DeepSpeed cases)" in result.stdout
    result = _bare("--check-wheels", "--wheels", str(folder))
    assert result.returncode == 1 and "fix: bash scripts/gpu_wheels.sh" in result.stdout
    _wheels(folder, ["deepspeed-0.19.8-py3-none-any.whl", "deepspeed-0.19.7-py3-none-any.whl"])
    result = _bare("--check-wheels", "--wheels", str(folder))
    assert result.returncode == 1 and "2 deepspeed wheels" in result.stdout
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert "gpu_plan.py --check-wheels || exit 3" in script  # before the install, before any case


def test_the_scripts_need_no_build_tools_and_are_time_boxed():
    wheels = (REPO / "scripts" / "gpu_wheels.sh").read_text()
    # pip's isolated build brings setuptools and wheel: a bare python3 (setuptools 65, no wheel) builds DeepSpeed
    commands = [line for line in wheels.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert not any("--no-build-isolation" in line for line in commands)
    assert "gpu_plan.py --check-wheels" in commands[-1]
    check = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert 'PYTHON="${PYTHON:-python3}"' in check and "--no-index" in check
    assert re.search(r"timeout (\d+) \"\$PYTHON\" scripts/gpu_run.py", check)


@ci_only
def test_a_stuck_case_costs_its_bound_and_the_results_survive(tmp_path):
    gpu_run = _runner()
    pid_file = tmp_path / "worker.pid"
    (tmp_path / "test_cases.py").write_text(
        "import subprocess, sys, time\n\n"
        "def test_first():\n    pass\n\n"
        "def test_stuck():\n"
        "    # like torchrun's workers: a process in a session of its own, out of reach of pytest's process group\n"
        "    worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"    open({str(pid_file)!r}, 'w').write(str(worker.pid))\n"
        "    time.sleep(600)\n\n"
        "def test_after():\n    pass\n")
    Case = gpu_run.gpu_plan.Case
    cases = [Case("test_cases.py::test_first", 1, 30), Case("test_cases.py::test_stuck", 1, 5),
             Case("test_cases.py::test_after", 1, 30)]
    results = gpu_run.run(cases, tmp_path / "out", budget=240, cwd=tmp_path, extra=("-p", "no:timeout"))
    table = gpu_run.outcomes(results)
    assert table["test_cases.py::test_first"][0] == "passed"
    assert table["test_cases.py::test_stuck"][0] == "timeout"
    assert table["test_cases.py::test_stuck"][2] == "stopped at its 5 s bound"
    assert table["test_cases.py::test_after"][0] == "passed"  # pytest started again after the stuck case
    assert not _alive(int(pid_file.read_text()))  # the stuck case's worker went with it
    events = [json.loads(line) for line in results.read_text().splitlines()]
    assert [e["case"] for e in events if e["event"] == "start"][:2] == ["test_cases.py::test_first",
                                                                          "test_cases.py::test_stuck"]
    # a run stopped at its budget records the case it stopped and what it never reached
    budget = gpu_run.gpu_plan.STARTUP + 20
    cases = [Case("test_cases.py::test_stuck", 1, 600), Case("test_cases.py::test_after", 1, 30)]
    results = gpu_run.run(cases, tmp_path / "short", budget=budget, cwd=tmp_path, extra=("-p", "no:timeout"))
    table = gpu_run.outcomes(results)
    assert table["test_cases.py::test_stuck"][0::2] == ("timeout", f"stopped at the run's {budget} s budget")
    assert table["test_cases.py::test_after"] == ("not run", 0, f"the run's {budget} s budget was spent")


@ci_only
def test_every_case_runs_its_cpu_twin_here():
    """Issue 41 item 5: fp8, the timings and bitsandbytes skipped on CPU, so CI never ran their code. Now a case may
    skip here only for a library this machine lacks (pytest --setup-only: the skip marks, no test bodies)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--setup-only", "-q", "-p", "no:cacheprovider", "-rs",
                             "tests/gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("is not installed" in line for line in skips), skips
