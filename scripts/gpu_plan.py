"""The GPU suite's plan: every case of tests/gpu/ in the order it runs (most valuable first), each with an estimate
and a bound on one H100/H200, the carried wheels it needs, and whether the plan fits the device's window.

    python3 scripts/gpu_plan.py                 # = `bash scripts/gpu_check.sh --dry-run`: the plan, exit 1 if it does not fit
    python3 scripts/gpu_plan.py --check-wheels  # the end of scripts/gpu_wheels.sh: exit 1 if a needed wheel is missing

Standard library only: the dry run works on a bare python3 (no torch, no pytest), here, before anything travels.
`tests/gpu/test_gpu_check_plan.py` checks in CI that CASES is exactly what pytest collects in tests/gpu.

The window: a session holds the GPU machine 15 minutes (900 s) in all, its start included, and 10 minutes a
command. The run (scripts/gpu_run.py) stops at RUN_BUDGET; each case is stopped at its bound (BOUND at most), so a
stuck case costs its bound, not the run. The plan fits when the estimated run plus the worst single overrun (one
case stuck to its bound, and pytest started again after it) stays inside RUN_BUDGET; what the session has left after
it is the room for a rerun of the failed cases (`bash scripts/gpu_check.sh --cases ID ...`).
Estimates are guesses until a GPU run records times (docs/gpu_validation.md): process start, torch import and NCCL
set-up dominate (about 10 s a launch), not the GPU work.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SESSION = 900  # the device time of a session, machine start included
MACHINE_START = 120  # a fresh machine's start and the working tree's transfer, counted against the session
COMMAND_LIMIT = 600  # one command on the device
RUN_BUDGET = 480  # the whole run of the cases (gpu_run.py stops there); the wheels' install and the table come on top
STARTUP = 15  # one pytest start on the GPU machine: interpreter, torch import, collection
BOUND = 90  # no case runs longer than this
SETUP = 30  # gpu_check.sh before the run: installing the carried wheels, the device table
WHEEL_LIMIT_MIB = 40  # the carried wheels, beside the repository, inside the 64 MiB the working tree may take
# distribution name (as in a wheel's file name) -> what needs it
NEEDED_WHEELS = {
    "torchao": "the fp8 cases", "deepspeed": "the DeepSpeed cases", "hjson": "deepspeed",
    "pydantic": "deepspeed", "pydantic_core": "pydantic", "annotated_types": "pydantic",
    "typing_inspection": "pydantic",
}


@dataclass(frozen=True)
class Case:
    node: str  # pytest's node id
    estimate: int  # seconds on one GPU; 0: skips there, with `skips`
    bound: int = BOUND
    skips: str = ""


def _case(file: str, name: str, estimate: int, bound: int | None = None, skips: str = "") -> Case:
    if bound is None:  # three times the guess, for a cold cache and a slow first compile, within BOUND
        bound = min(BOUND, max(30, 3 * estimate)) if estimate else 10
    return Case(f"tests/gpu/{file}::{name}", estimate, bound, skips)


ROUND_TRIP = "test_round_trip_tracks_the_reference_and_continues_identically"
TWO_GPUS = "needs 2 GPUs (its gloo twin runs in CI)"
# Most valuable first: what every GPU user meets (the NCCL group, the backends), then what a finding of review
# changed, then the rest; the timings last, and the cases that skip on one GPU at the very end.
CASES = [
    _case("test_nccl.py", "test_world_1_is_a_real_group_with_control_plane_and_fsdp_prepare", 25),
    _case("test_backends_gpu.py", f"{ROUND_TRIP}[fsdp2]", 20),
    _case("test_backends_gpu.py", f"{ROUND_TRIP}[ddp]", 20),
    _case("test_offload_and_io_gpu.py", "test_fsdp2_ram_efficient_loading_with_cpu_offload_keeps_shards_on_cpu", 20),
    _case("test_fp8_gpu.py", "test_fp8_torchao_tracks_bf16[fsdp2]", 45, bound=BOUND),
    _case("test_backends_gpu.py", f"{ROUND_TRIP}[deepspeed-zero2]", 35, bound=BOUND),
    _case("test_backends_gpu.py", f"{ROUND_TRIP}[deepspeed-zero3]", 35, bound=BOUND),
    _case("test_backends_gpu.py", f"{ROUND_TRIP}[fsdp1]", 20),
    _case("test_precision_gpu.py", "test_fp16_overflow_skips_step_and_holds_scheduler[adamw]", 3),
    _case("test_precision_gpu.py", "test_fp16_overflow_skips_step_and_holds_scheduler[fused-adamw]", 3),
    _case("test_precision_gpu.py", "test_bf16_autocast_runs_matmuls_in_bf16_and_returns_fp32", 2),
    _case("test_fp8_gpu.py", "test_fp8_torchao_tracks_bf16[one-process]", 40, bound=BOUND),
    _case("test_offload_and_io_gpu.py", "test_async_save_from_cuda_commits_and_loads", 4),
    _case("test_offload_and_io_gpu.py", "test_device_map_over_cuda_cpu_and_disk_equals_the_full_model", 4),
    _case("test_nccl.py", "test_two_processes_on_one_gpu_run_the_control_plane", 25),
    _case("test_perf_gpu.py", "test_bf16_step_hasten_over_raw", 25),
    _case("test_perf_gpu.py", "test_big_model_time_to_first_output_against_accelerate", 30),
    _case("test_perf_gpu.py", "test_raw_and_hasten_rounds_alternate", 1),
    _case("test_backends_gpu.py", f"{ROUND_TRIP}[tp]", 0, skips=TWO_GPUS),
    _case("test_nccl.py", "test_world_2_control_plane_and_fsdp_prepare", 0, skips=TWO_GPUS),
    _case("test_hang_doctor_gpu.py", "test_queued_collective_is_reported_before_the_backends_own_timeout", 0,
          skips=TWO_GPUS),
    _case("test_offload_and_io_gpu.py", "test_bnb_quantized_linear_runs_on_the_device_close_to_full[8]", 0,
          skips="bitsandbytes cannot travel (CUDA builds past 64 MiB)"),
    _case("test_offload_and_io_gpu.py", "test_bnb_quantized_linear_runs_on_the_device_close_to_full[4]", 0,
          skips="bitsandbytes cannot travel (CUDA builds past 64 MiB)"),
    _case("test_gpu_check_plan.py", "test_the_plan_is_what_pytest_collects_and_fits", 0, skips="CI only"),
    _case("test_gpu_check_plan.py", "test_a_missing_or_doubled_wheel_fails_loudly_before_anything_runs", 0,
          skips="CI only"),
    _case("test_gpu_check_plan.py", "test_the_scripts_need_no_build_tools_and_are_time_boxed", 1),
    _case("test_gpu_check_plan.py", "test_a_stuck_case_costs_its_bound_and_the_results_survive", 0, skips="CI only"),
    _case("test_gpu_check_plan.py", "test_every_case_runs_its_cpu_twin_here", 0, skips="CI only"),
]


def wheel_problems(folder: Path) -> list[str]:
    """What is wrong with the carried wheels in `folder` (empty: nothing)."""
    found: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.whl")):
        name = re.split(r"-\d", path.name, maxsplit=1)[0].lower().replace("-", "_")
        found.setdefault(name, []).append(path.name)
    problems = [f"no {name} wheel (needed by {why})" for name, why in NEEDED_WHEELS.items() if name not in found]
    problems += [f"{len(files)} {name} wheels ({', '.join(files)}): keep one, two stop the install"
                 for name, files in found.items() if len(files) > 1]
    size = sum(path.stat().st_size for path in folder.glob("*.whl")) / 2**20
    if size > WHEEL_LIMIT_MIB:
        problems.append(f"the wheels take {size:.1f} MiB, past {WHEEL_LIMIT_MIB} MiB (the working tree travels in 64)")
    return problems


def check_wheels(folder: Path) -> int:
    problems = wheel_problems(folder)
    if problems:
        print(f"gpu wheels: {folder} is not ready: " + "; ".join(problems) + " (fix: bash scripts/gpu_wheels.sh)")
        return 1
    size = sum(path.stat().st_size for path in folder.glob("*.whl")) / 2**20
    print(f"gpu wheels: {len(list(folder.glob('*.whl')))} wheels, {size:.1f} MiB, every one the suite needs")
    return 0


def selected(cases: list[str] | None) -> list[Case]:
    """The planned cases, in plan order; `cases`: only these node ids (a rerun), refused when one is unknown."""
    if not cases:
        return list(CASES)
    known = {case.node: case for case in CASES}
    unknown = [node for node in cases if node not in known]
    if unknown:
        raise SystemExit(f"gpu plan: unknown case(s) {', '.join(unknown)}; the cases are listed by --dry-run")
    return [case for case in CASES if case.node in set(cases)]


def fits(cases: list[Case]) -> tuple[int, int, list[str]]:
    """(estimated run, worst run with one case stuck to its bound, problems)."""
    problems = [f"{case.node}: bound {case.bound} s past the {BOUND} s a case may take"
                for case in cases if case.bound > BOUND]
    problems += [f"{case.node}: bound {case.bound} s below its estimate {case.estimate} s"
                 for case in cases if case.bound < case.estimate]
    expected = STARTUP + sum(case.estimate for case in cases)
    overrun = max((case.bound - case.estimate for case in cases if case.estimate), default=0)
    worst = expected + overrun + STARTUP  # pytest is started again for the cases after the stuck one
    if worst > RUN_BUDGET:
        problems.append(f"the plan ({expected} s, {worst} s with one case stuck) does not fit the run's {RUN_BUDGET} s")
    return expected, worst, problems


def dry_run(cases: list[Case], wheels: Path) -> int:
    print(f"{'case (in the order it runs)':<118} {'estimate':>8} {'bound':>6}")
    for case in cases:
        note = f"  (skips: {case.skips})" if case.skips else ""
        print(f"{case.node:<118} {case.estimate:>6} s {case.bound:>4} s{note}")
    expected, worst, problems = fits(cases)
    print(f"{'pytest start-up':<118} {STARTUP:>6} s")
    print(f"{len(cases)} cases; estimated run {expected} s, {worst} s with one case stuck to its bound, "
          f"of the run's {RUN_BUDGET} s")
    spent = MACHINE_START + SETUP + RUN_BUDGET
    warm = SESSION - spent - SETUP - STARTUP
    print(f"session: {MACHINE_START} s machine start + {SETUP} s set-up + {RUN_BUDGET} s run = {spent} s of {SESSION} s "
          f"at most; room for a rerun of the failed cases (bash scripts/gpu_check.sh --cases ID ...): {warm} s of "
          f"their bounds on the still-warm machine (30 s idle), {warm - MACHINE_START} s on a fresh one")
    if RUN_BUDGET + SETUP > COMMAND_LIMIT - 30:
        problems.append(f"the run and its set-up ({RUN_BUDGET + SETUP} s) leave under 30 s of the device's "
                        f"{COMMAND_LIMIT} s command limit")
    problems += wheel_problems(wheels)
    if problems:
        print("gpu_check --dry-run: " + "; ".join(problems))
        return 1
    print(f"carried wheels: {wheels} holds every wheel the suite needs")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check-wheels", action="store_true", help="only check the carried wheels")
    parser.add_argument("--wheels", default=os.environ.get("GPU_WHEELS", str(REPO / ".whl")))
    parser.add_argument("--cases", nargs="*", help="plan only these node ids (a rerun of the failed cases)")
    args = parser.parse_args()
    if args.check_wheels:
        return check_wheels(Path(args.wheels))
    return dry_run(selected(args.cases), Path(args.wheels))


if __name__ == "__main__":
    sys.exit(main())
