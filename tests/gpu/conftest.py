"""The GPU suite: everything CUDA-specific, run by `bash scripts/gpu_check.sh` on a machine with a GPU.

Without CUDA (CI) every case runs its CPU twin: the same code (worker script or test body) on cpu/gloo, where only
what means something on a GPU alone is skipped, by name, with the reason (`device_only` in
tests/workers/gpu_common.py; timing checks and the fp8 device check), so a mistake in a test's own code fails CI,
not the rare GPU run. Cases that need two GPUs skip on one GPU and run their gloo twin in CI. docs/gpu_validation.md
says, case by case, what only the GPU runs. Helpers: gpu_suite.py.
"""
