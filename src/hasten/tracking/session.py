"""`filter_trackers` and `TrackerSession`: what `Accelerator(log_with=...)`, `init_trackers`, `log`,
`get_tracker` and `end_training` delegate to."""

from __future__ import annotations

import atexit
import logging
import os
import traceback
import warnings
from collections.abc import Mapping

from ..core.errors import ConfigError, TrackerError
from .base import (
    GeneralTracker,
    _name_of,
    get_available_trackers,
    install_hint,
    is_tracker_installed,
    known_tracker_names,
    tracker_class,
)

logger = logging.getLogger(__name__)

ERROR_POLICY_ENV = "HASTEN_TRACKER_ERRORS"


def filter_trackers(log_with, logging_dir=None) -> list:
    """Check `Accelerator(log_with=...)` and keep what can run here.

    Returns a list of `LoggerType` members, registered custom names (str) and `GeneralTracker` instances,
    without duplicates. `"all"` means every installed built-in tracker plus the instances given. A built-in
    tracker whose library is missing is dropped with a warning carrying its install command.
    """
    from ..core.enums import LoggerType

    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    instances = [item for item in items if isinstance(item, GeneralTracker)]
    names = [item for item in items if not isinstance(item, GeneralTracker)]
    for item in names:
        if not isinstance(item, (str, LoggerType)):
            raise ConfigError(
                f"log_with entries must be tracker names, LoggerType members or GeneralTracker instances, "
                f"got {item!r} ({type(item).__name__})"
            )
    if any(_name_of(item) == LoggerType.ALL.value for item in names):
        wanted = list(get_available_trackers())
        if logging_dir is None:
            dropped = [kind for kind in wanted if tracker_class(kind).requires_logging_directory]
            if dropped:
                warnings.warn(
                    f"log_with='all': skipping {[kind.value for kind in dropped]}, which need a logging directory; "
                    "pass project_dir= or ProjectConfiguration(logging_dir=...) to keep them",
                    stacklevel=3,
                )
            wanted = [kind for kind in wanted if kind not in dropped]
        wanted += instances
    else:
        wanted = []
        for item in items:  # the user's order is the order trackers start in
            if isinstance(item, GeneralTracker):
                wanted.append(item)
                continue
            name = _name_of(item)
            if name not in known_tracker_names():
                raise ConfigError(
                    f"log_with={name!r} is not a known tracker; choose from {sorted(known_tracker_names())}, "
                    "'all', or register yours with register_tracker_class"
                )
            if not is_tracker_installed(name):
                warnings.warn(f"log_with={name!r} is skipped: its library is not installed ({install_hint(name)})",
                              stacklevel=3)
                continue
            if logging_dir is None and tracker_class(name).requires_logging_directory:
                raise ConfigError(
                    f"Logging with `{name}` requires a `logging_dir` to be passed in: pass project_dir= to the "
                    "Accelerator or ProjectConfiguration(logging_dir=...)"
                )
            wanted.append(LoggerType(name) if name in LoggerType else name)
    result = []
    for item in wanted:
        if not any(item is kept or (not isinstance(item, GeneralTracker) and item == kept) for kept in result):
            result.append(item)
    return result


class TrackerSession:
    """The trackers of one Accelerator: builds and starts them, fans `log` out, closes them once.

    Trackers with `main_process_only = True` (every built-in) exist only on the main process; the others
    are built on every process. The session closes its trackers at interpreter exit if `finish()` was not
    called, so a run that dies with an exception still flushes its last values.

    `on_error` is what a tracker failing in `log` does (default: the `tracker_errors` setting,
    `HASTEN_TRACKER_ERRORS`): "propagate" lets the library's exception through, as Accelerate does; "warn"
    warns once per tracker, counts later failures and reports them at `finish()`; "raise" raises `TrackerError`.
    """

    def __init__(self, log_with=None, logging_dir=None, on_error: str | None = None):
        self.log_with = list(log_with or [])
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.on_error = _error_policy(on_error)
        self.trackers: list[GeneralTracker] = []
        self.failures: dict[str, int] = {}
        self._exit_hook_registered = False
        self._open = False  # started and not finished; `trackers` still lists them after end_training, as Accelerate's

    # -- init_trackers --------------------------------------------------------------------------------
    def start(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        init_kwargs = dict(init_kwargs or {})
        if project_name is not None and not isinstance(project_name, str):
            raise ConfigError(f"init_trackers needs project_name as a string (or None), got {project_name!r}")
        if config is not None and not isinstance(config, Mapping):
            config = _config_as_dict(config)
        from ..config.resolve import strict

        if self._open and self.trackers and strict():
            raise RuntimeError("init_trackers was already called: call end_training() before starting new trackers "
                               "(an error under hasten's strict setting; unset HASTEN_STRICT to add runs as Accelerate)")
        is_main = _is_main_process()
        unused = set(init_kwargs) - {_name_of(spec) if not isinstance(spec, GeneralTracker) else spec.name
                                     for spec in self.log_with}
        if unused:
            warnings.warn(f"init_kwargs for {sorted(unused)} are ignored: no such tracker in log_with", stacklevel=3)
        built = []
        for spec in self.log_with:
            if isinstance(spec, GeneralTracker):
                if spec.main_process_only and not is_main:
                    continue
                built.append(spec)
                continue
            name = _name_of(spec)
            cls = tracker_class(name)
            if cls.main_process_only and not is_main:
                continue
            kwargs = init_kwargs.get(name, {})
            if cls.requires_logging_directory:
                if project_name is None:
                    raise ConfigError(f"init_trackers(project_name=None): the {name!r} tracker names its folder under "
                                      "the logging directory after the project; pass a project name")
                built.append(cls(project_name, self.logging_dir, **kwargs))
            else:
                built.append(cls(project_name, **kwargs))
        if not self._open:
            self.failures = {}
        self._register_exit_hook()
        # A second init_trackers without end_training() does what Accelerate's does: the new trackers join the
        # list and every tracker in it, the earlier ones included, is started again and given the config.
        earlier = list(self.trackers)
        everything = earlier + built
        self.trackers = []
        for index, tracker in enumerate(everything):
            try:
                tracker.start()
            except BaseException:
                # The runs already started are closed; the error (often a missing library) is the user's to see.
                self.trackers += [kept for kept in everything[index + 1:] if any(kept is old for old in earlier)]
                self._open = True
                self.finish()
                self.trackers = []  # none of them runs: a retry after the fix starts them afresh
                raise
            self.trackers.append(tracker)
        self._open = True
        if config is not None:
            for tracker in everything:
                tracker.store_init_configuration(dict(config))

    # -- log ------------------------------------------------------------------------------------------
    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        if not isinstance(values, Mapping):
            raise TypeError(f"log expects a dict of name -> value, got {type(values).__name__}")
        if step is not None and not isinstance(step, int):
            step = int(step)  # a 0-dim tensor or numpy integer
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            kwargs = log_kwargs.get(tracker.name, {})
            if self.on_error == "propagate":  # Accelerate's behaviour: the library's own exception
                tracker.log(values, step=step, **kwargs)
                continue
            try:
                tracker.log(values, step=step, **kwargs)
            except Exception as error:  # noqa: BLE001 - the policy below decides
                self._log_failed(tracker, step, error)

    def _log_failed(self, tracker: GeneralTracker, step, error: Exception) -> None:
        name = getattr(tracker, "name", type(tracker).__name__)
        message = f"tracker {name!r} failed to log step {step}: {type(error).__name__}: {error}"
        if self.on_error == "raise":
            raise TrackerError(f"{message} (set {ERROR_POLICY_ENV}=warn to keep training)") from error
        self.failures[name] = self.failures.get(name, 0) + 1
        if self.failures[name] == 1:
            details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            warnings.warn(
                f"{message}. Training goes on; later failures of this tracker are counted and reported at "
                f"end_training (unset {ERROR_POLICY_ENV} or set it to raise to stop instead).\n{details}",
                RuntimeWarning,
                stacklevel=4,
            )

    # -- get_tracker ----------------------------------------------------------------------------------
    def get(self, name: str, unwrap: bool = False):
        name = _name_of(name)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if not self.trackers:
            return GeneralTracker(_blank=True)
        raise ValueError(f"no started tracker is named {name!r}; started: {[tracker.name for tracker in self.trackers]}")

    # -- end_training ---------------------------------------------------------------------------------
    def finish(self) -> None:
        """Close every tracker; one that fails to close is reported and the others are still closed."""
        trackers = list(self.trackers) if self._open else []
        self._open = False  # the list stays: Accelerate's `trackers` still names them after end_training()
        self._unregister_exit_hook()
        # Last started, first closed: several libraries wrap sys.stdout/sys.stderr to capture the console,
        # and unwinding those wrappers out of order leaves a cycle (RecursionError at exit).
        for tracker in reversed(trackers):
            try:
                tracker.finish()
            except Exception as error:  # noqa: BLE001 - keep closing the rest
                warnings.warn(f"tracker {getattr(tracker, 'name', tracker)!r} failed to finish: "
                              f"{type(error).__name__}: {error}", RuntimeWarning, stacklevel=3)
        for name, count in self.failures.items():
            warnings.warn(f"tracker {name!r} failed {count} log call(s) during this run", RuntimeWarning, stacklevel=3)
        self.failures = {}

    def _register_exit_hook(self) -> None:
        if not self._exit_hook_registered:
            atexit.register(self._finish_at_exit)
            self._exit_hook_registered = True

    def _unregister_exit_hook(self) -> None:
        if self._exit_hook_registered:
            atexit.unregister(self._finish_at_exit)
            self._exit_hook_registered = False

    def _finish_at_exit(self) -> None:
        if self._open and self.trackers:
            logger.info("closing %d tracker(s) at exit: end_training() was not called", len(self.trackers))
            self.finish()


def _error_policy(on_error: str | None) -> str:
    from ..config.resolve import resolve
    from ..config.settings import get

    if on_error is None:
        return resolve(settings=[get("tracker_errors")])["tracker_errors"].value
    try:
        return get("tracker_errors").convert(on_error)
    except ValueError as error:
        raise ConfigError(f"TrackerSession(on_error={on_error!r}): {error}") from None


def _is_main_process() -> bool:
    from ..state import PartialState

    return PartialState().is_main_process


def _config_as_dict(config) -> dict:
    # argparse.Namespace and dataclasses are common ways to hold hyperparameters.
    import dataclasses

    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise ConfigError(f"init_trackers config must be a dict (or a dataclass / Namespace), got {type(config).__name__}")
