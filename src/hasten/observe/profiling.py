"""`Accelerator.profile()`: a `torch.profiler.profile` built from `ProfileKwargs`, with each rank's Chrome trace
written to `output_trace_dir/profile_<rank>.json` when the context ends.

Two endings that crash Accelerate's `profile()` after the profiled code has run end here with a warning instead,
so a long job is not lost to its profiler: a block that ends before the schedule started profiling (nothing to
export), and an `on_trace_ready` (such as `torch.profiler.tensorboard_trace_handler`) that already saved the last
cycle (torch saves a trace once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

from ..core.constants import PROFILE_PATTERN_NAME

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def profile(accelerator, profile_handler=None):
    """Yield the torch profiler built from `profile_handler` (else the Accelerator's, else defaults)."""
    from ..config.handlers import ProfileKwargs

    handler = profile_handler or accelerator.profile_handler or ProfileKwargs()
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    path = os.path.join(handler.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=accelerator.process_index))
    export_chrome_trace(profiler, path, handler)
    accelerator.wait_for_everyone()


def export_chrome_trace(profiler, path: str, handler) -> bool:
    """Write the profiler's last recorded cycle to `path`; False (with a warning) when there is nothing to write."""
    if getattr(profiler, "profiler", None) is None:
        warnings.warn(
            f"{path} not written: the profiler recorded no step (schedule {handler.schedule_option} was still "
            f"skipping or waiting after {profiler.step_num} calls to prof.step()); call prof.step() once per step "
            "or shorten the schedule",
            RuntimeWarning, stacklevel=3,
        )
        return False
    try:
        profiler.export_chrome_trace(path)
    except RuntimeError as error:
        if handler.on_trace_ready is None:
            raise
        warnings.warn(
            f"{path} not written: on_trace_ready already saved the last recorded cycle ({error}); torch saves a "
            "trace once, so pass either output_trace_dir or a saving on_trace_ready",
            RuntimeWarning, stacklevel=3,
        )
        return False
    logger.debug("wrote Chrome trace %s", path)
    return True


__all__ = ["export_chrome_trace", "profile"]
