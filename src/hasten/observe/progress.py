"""Progress bars (Accelerate's `accelerate.utils.tqdm`) shown by the local main process only.

A bar is shown only by the local main process (unless `main_process_only=False`), as in Accelerate also when its
output is a log file, and never when switched off with `disable=True` or the environment
(`HASTEN_DISABLE_PROGRESS_BARS=1`, or tqdm's own `TQDM_DISABLE=1`). tqdm's own `disable=None` keeps bars to
terminals only (a log file or a CI pipe then gets no bar lines).
"""

from __future__ import annotations

import importlib.util
import os

from ..core.env import str_to_bool

_SWITCHES = ("HASTEN_DISABLE_PROGRESS_BARS", "ACCELERATE_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")


def progress_bars_disabled() -> bool:
    """True when the environment switches progress bars off."""
    for name in _SWITCHES:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                if str_to_bool(value, to_bool=True):
                    return True
            except ValueError:
                return True  # any other non-empty value reads as "off", as tqdm reads TQDM_DISABLE
    return False


def _show_here(main_process_only: bool) -> bool:
    if not main_process_only:
        return True
    from ..state import PartialState

    return PartialState().is_local_main_process


def tqdm(*args, main_process_only: bool = True, **kwargs):
    """`tqdm.auto.tqdm(*args, **kwargs)` shown on the local main process only (all processes with
    `main_process_only=False`), and not when switched off (see the module's doc); `disable=None`: terminals only.

    The first positional argument is the iterable; a bool there is refused (Accelerate 0.x took
    `main_process_only` first).
    """
    if importlib.util.find_spec("tqdm") is None:
        raise ImportError('hasten.utils.tqdm needs tqdm: pip install "hasten[progress]"')
    if args and isinstance(args[0], bool):
        raise ValueError("pass main_process_only as a keyword: tqdm(iterable, main_process_only=True); "
                         "the first positional argument is the iterable")
    from tqdm.auto import tqdm as _tqdm

    disable = kwargs.pop("disable", False)  # Accelerate's default: draw, also into a log file
    if disable is not True and (progress_bars_disabled() or not _show_here(main_process_only)):
        disable = True
    return _tqdm(*args, **kwargs, disable=disable)
