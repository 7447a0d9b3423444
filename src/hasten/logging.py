"""`get_logger`: a logger that knows which process it runs in."""

from __future__ import annotations

import functools
import logging

from .state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):
    """Logs on the main process only by default; `main_process_only=False` logs everywhere and
    `in_order=True` logs on every process one rank after the other. Messages are prefixed `[RANK i]`."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        return not main_process_only or PartialState().is_main_process

    def process(self, msg, kwargs):
        """The message as logged (`[RANK i] msg`, with the adapter's `extra`); `stacklevel` defaults to 2 so the
        record names the caller, not this adapter. A subclass may override it, as with any `LoggerAdapter`."""
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level, msg, *args, **kwargs):
        if not PartialState._shared_state:
            raise RuntimeError(
                "You must initialize the hasten state by calling either `PartialState()` or `Accelerator()` "
                "before using the logging utility."
            )
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        state = PartialState()
        msg, kwargs = self.process(msg, kwargs)
        if in_order:
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    self.logger.log(level, msg, *args, **kwargs)
                state.wait_for_everyone()
        elif self._should_log(main_process_only):
            self.logger.log(level, msg, *args, **kwargs)

    @functools.lru_cache(None)
    def warning_once(self, *args, **kwargs):
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A process-aware logger; the level comes from `log_level` or `HASTEN_LOG_LEVEL`/`ACCELERATE_LOG_LEVEL`."""
    if log_level is None:
        from .config.resolve import runtime_value  # HASTEN_/ACCELERATE_LOG_LEVEL, by the settings table

        log_level = runtime_value("log_level").value
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
