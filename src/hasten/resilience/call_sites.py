"""Where a call came from, as the hang doctor reports it: the first frame outside hasten, torch and the standard
library's context helpers (`call_site`), and a stack trimmed to the user's frames (`stack_lines`).
"""

from __future__ import annotations

import functools
import os
import sys
import threading


@functools.cache
def skip_prefixes() -> tuple:
    """Paths whose frames are not the user's: hasten's package, torch, contextlib, functools, threading."""
    import contextlib

    import torch

    hasten_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # this file is in resilience/
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return (hasten_dir, torch_dir, contextlib.__file__, functools.__file__, threading.__file__)


@functools.lru_cache(maxsize=4096)
def short(path: str) -> str:
    marker = f"{os.sep}site-packages{os.sep}"
    if marker in path:  # an installed library: `torch/distributed/distributed_c10d.py`
        return path.rsplit(marker, 1)[1]
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def user_frame(frame):
    skip = skip_prefixes()
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    return frame


def call_site(depth: int = 1) -> str:
    """`file:line` of the first caller (from `depth` frames up) outside hasten, torch and contextlib."""
    try:
        frame = sys._getframe(depth)
    except ValueError:  # a shallower stack than the caller expected
        frame = sys._getframe(1)
    frame = user_frame(frame)
    if frame is None:
        return "<unknown>"
    return f"{short(frame.f_code.co_filename)}:{frame.f_lineno}"


def stack_lines(frame, limit: int = 8) -> list:
    """The user's frames of a stack, innermost last, as `file:line in function` (hasten/torch frames left out)."""
    skip = skip_prefixes()
    lines = []
    innermost = None
    while frame is not None:
        if innermost is None:
            innermost = frame
        if not frame.f_code.co_filename.startswith(skip):
            lines.append(f"{short(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    lines.reverse()
    lines = lines[-limit:]
    if innermost is not None and innermost.f_code.co_filename.startswith(skip[1:]):
        lines.append(f"(inside {short(innermost.f_code.co_filename)}:{innermost.f_lineno} "
                     f"in {innermost.f_code.co_name})")
    return lines
