"""`bash scripts/gpu_check.sh --dry-run`: the GPU suite's planned cases, each with its time estimate on one H100,
and the total against the script's inner timeout. Fails (exit 1) when a case has no estimate or the total does
not fit, so a new GPU case cannot silently push the suite past the device's window.

The estimates are guesses until a GPU run records real times (docs/gpu_validation.md): process start, torch import
and NCCL set-up dominate (about 10 s a launch), not the GPU work.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

# test function (or "function[id]") -> seconds on one H100; 0: skips on one GPU, with its reason
ESTIMATES = {
    "test_round_trip_tracks_the_reference_and_continues_identically[ddp]": 20,
    "test_round_trip_tracks_the_reference_and_continues_identically[fsdp1]": 20,
    "test_round_trip_tracks_the_reference_and_continues_identically[fsdp2]": 20,
    "test_round_trip_tracks_the_reference_and_continues_identically[tp]": 0,
    "test_round_trip_tracks_the_reference_and_continues_identically[deepspeed-zero2]": 35,
    "test_round_trip_tracks_the_reference_and_continues_identically[deepspeed-zero3]": 35,
    "test_fp8_torchao_tracks_bf16": 45,
    "test_queued_collective_is_reported_before_the_backends_own_timeout": 0,
    "test_world_1_is_a_real_group_with_control_plane_and_fsdp_prepare": 25,
    "test_world_2_control_plane_and_fsdp_prepare": 0,
    "test_two_processes_on_one_gpu_run_the_control_plane": 25,
    "test_fsdp2_ram_efficient_loading_with_cpu_offload_keeps_shards_on_cpu": 20,
    "test_async_save_from_cuda_commits_and_loads": 4,
    "test_device_map_over_cuda_cpu_and_disk_equals_the_full_model": 4,
    "test_bnb_quantized_linear_runs_on_cuda_close_to_full": 0,
    "test_bf16_transformer_step_hasten_over_raw": 25,
    "test_big_model_time_to_first_output_against_accelerate": 35,
    "test_dry_run_lists_every_case_with_an_estimate_that_fits": 0,
    "test_the_script_is_time_boxed_for_the_device": 1,
    "test_fp16_overflow_skips_step_and_holds_scheduler": 3,
    "test_bf16_autocast_runs_matmuls_in_bf16_and_returns_fp32": 2,
}
WHY_ZERO = {
    "[tp]": "needs 2 GPUs", "queued_collective": "needs 2 GPUs", "world_2": "needs 2 GPUs",
    "bnb": "bitsandbytes cannot travel (CUDA builds past 64 MiB)", "dry_run": "CI only",
}
STARTUP = 15  # pytest start, the carried wheels' install, the device table


def estimate(node_id: str) -> int | None:
    name = node_id.split("::")[-1]
    if name in ESTIMATES:
        return ESTIMATES[name]
    return ESTIMATES.get(name.split("[")[0])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=420)
    args, extra = parser.parse_known_args()
    found = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "tests/gpu", *extra], capture_output=True, text=True)
    ids = [line.strip() for line in found.stdout.splitlines() if "::" in line]
    if found.returncode != 0 or not ids:
        print(found.stdout + found.stderr)
        print("gpu_check --dry-run: the GPU suite does not collect")
        return 1
    total, missing = STARTUP, []
    print(f"{'case':<100} estimate on one H100")
    for node in ids:
        seconds = estimate(node)
        if seconds is None:
            missing.append(node)
            continue
        total += seconds
        why = next((w for k, w in WHY_ZERO.items() if k in node), "") if seconds == 0 else ""
        print(f"{node:<100} {seconds:>4} s{'  (skips: ' + why + ')' if why else ''}")
    print(f"{'start-up':<100} {STARTUP:>4} s")
    print(f"{len(ids)} cases; estimated total {total} s of the {args.budget:.0f} s inner timeout")
    if missing:
        print("gpu_check --dry-run: no estimate for " + ", ".join(missing) + " (add one to scripts/gpu_plan.py)")
        return 1
    if total > args.budget:
        print(f"gpu_check --dry-run: the plan ({total} s) does not fit the {args.budget:.0f} s inner timeout")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
