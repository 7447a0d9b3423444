"""Accelerate's `utils.rich` path: importing it turns on rich's tracebacks (needs rich and
HASTEN_ENABLE_RICH=1 or ACCELERATE_ENABLE_RICH=1)."""

from ..core.availability import is_rich_available

if not is_rich_available():
    raise ModuleNotFoundError(
        "hasten.utils.rich needs rich, switched on: pip install \"hasten[rich]\", and set HASTEN_ENABLE_RICH=1 "
        "(or ACCELERATE_ENABLE_RICH=1)"
    )

from rich.traceback import install  # noqa: E402

install(show_locals=False)
