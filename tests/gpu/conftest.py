"""The GPU suite: everything CUDA-specific, run by `bash scripts/gpu_check.sh` on a machine with a GPU.

Without CUDA (CI) each case whose body is device-independent runs its CPU twin: the same worker script with
cpu/gloo, where only the assertions that mean something on a GPU alone are skipped, by name, with the reason
(tests/workers/gpu_common.py), so a mistake in a test's own code fails CI, not the rare GPU run. Cases that are
CUDA through and through (kernels, timings, bitsandbytes) skip on CPU with their reason. Helpers: gpu_suite.py.
"""
