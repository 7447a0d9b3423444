"""Launched with --mixed_precision fp8: builds the Accelerator, which on a machine that cannot run fp8 stops the run
with one line (tests/training/test_fp8.py checks it); on an fp8-capable GPU it prints what was set up."""

from hasten import Accelerator

accelerator = Accelerator()
print(f"fp8 set up: backend={accelerator.fp8_backend.value} handler={accelerator.precision.fp8.handler!r}")
