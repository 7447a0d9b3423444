"""The tracker interface, the main-process decorator, the name registry and value conversion helpers.

Nothing here imports a tracker library: each built-in tracker lives in its own module and imports its
library in `start()`, so `import hasten.tracking` stays cheap and never touches CUDA or the network.
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.util
import warnings
from collections.abc import Mapping, MutableMapping
from pathlib import PurePath

# name -> (module under hasten.tracking, class name, importable module that must exist, pip extra)
_BUILTIN = {
    "tensorboard": ("tensorboard", "TensorBoardTracker", "tensorboard", "tensorboard"),
    "wandb": ("wandb", "WandBTracker", "wandb", "wandb"),
    "trackio": ("trackio", "TrackioTracker", "trackio", "trackio"),
    "comet_ml": ("comet", "CometMLTracker", "comet_ml", "comet-ml"),
    "aim": ("aim", "AimTracker", "aim", "aim"),
    "mlflow": ("mlflow", "MLflowTracker", "mlflow", "mlflow"),
    "clearml": ("clearml", "ClearMLTracker", "clearml", "clearml"),
    "dvclive": ("dvclive", "DVCLiveTracker", "dvclive", "dvclive"),
    "swanlab": ("swanlab", "SwanLabTracker", "swanlab", "swanlab"),
    # hasten's own dependency-free tracker; not a LoggerType, so `log_with="all"` leaves it out.
    "jsonl": ("jsonl", "JSONLinesTracker", None, None),
}
_CUSTOM: dict[str, type] = {}


def on_main_process(method):
    """Run a tracker method only on the main process when the tracker says `main_process_only = True`.

    The attribute is read at call time, so flipping it on an instance or a subclass takes effect at once.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if getattr(self, "main_process_only", True):
            from ..state import PartialState

            if not PartialState().is_main_process:
                return None
        return method(self, *args, **kwargs)

    return wrapper


class GeneralTracker:
    """Base class of every tracker. Subclasses set `name` and `requires_logging_directory` and define a
    `tracker` property returning the library's own object (writer, run, experiment).

    Every method is optional and a no-op here. `GeneralTracker(_blank=True)` is a tracker that does nothing,
    returned by `get_tracker` on processes that have no trackers.
    """

    main_process_only = True

    def __init__(self, _blank: bool = False):
        if _blank:
            return
        missing = [attribute for attribute in ("name", "requires_logging_directory") if not hasattr(type(self), attribute)]
        if _tracker_property_missing(type(self)):
            missing.append("tracker")
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} must define {', '.join(f'`{name}`' for name in missing)} to subclass "
                "GeneralTracker: `name` (str), `requires_logging_directory` (bool) and a `tracker` property"
            )

    @property
    def tracker(self):
        return None

    def start(self):
        """Create the library's run/writer. Called once by `init_trackers`, after every tracker is built."""

    def store_init_configuration(self, values: dict):
        """Record the run's hyperparameters."""

    def log(self, values: dict, step: int | None = None, **kwargs):
        """Record `values` (name -> value) at `step`."""

    def finish(self):
        """Flush and close the run."""


class ProjectRunTracker(GeneralTracker):
    """A library that starts one run with `<library>.init(project=run_name, **init_kwargs)`, logs with
    `run.log(values, step=...)`, keeps hyperparameters in `run.config` and ends with `run.finish()`
    (wandb, trackio and swanlab share this shape). Subclasses set `name` and may extend `start`."""

    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = None

    @property
    def tracker(self):
        return self.run

    @on_main_process
    def start(self):
        self.run = import_library(self.name).init(project=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict):
        self.run.config.update(to_plain(values))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs):
        self.run.log({key: simplify(value) for key, value in values.items()}, step=step, **kwargs)

    @on_main_process
    def finish(self):
        if self.run is not None:
            self.run.finish()
            self.run = None


def _tracker_property_missing(cls) -> bool:
    for klass in cls.__mro__:
        if klass is GeneralTracker:
            return True
        if "tracker" in vars(klass):
            return False
    return True


# -- registry ---------------------------------------------------------------------------------------------


def register_tracker_class(tracker_class) -> None:
    """Make `log_with="<tracker_class.name>"` build `tracker_class`."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class expects a GeneralTracker subclass, got {tracker_class!r}")
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{tracker_class.__name__}.name must be a non-empty string to be registered")
    if not isinstance(getattr(tracker_class, "requires_logging_directory", None), bool):
        raise ValueError(f"{tracker_class.__name__}.requires_logging_directory must be set to True or False")
    if name in _BUILTIN or name in _CUSTOM:
        warnings.warn(f"register_tracker_class: {tracker_class.__name__} replaces the tracker named {name!r}",
                      stacklevel=2)
    _CUSTOM[name] = tracker_class


def tracker_class(name: str) -> type:
    """The class registered under `name` (custom registrations win over built-ins)."""
    name = _name_of(name)
    if name in _CUSTOM:
        return _CUSTOM[name]
    if name not in known_tracker_names():
        raise ValueError(f"unknown tracker {name!r}; choose one of {sorted(known_tracker_names())} or a GeneralTracker")
    return _builtin_class(name)


def _builtin_class(name: str) -> type:
    module, class_name, _, _ = _BUILTIN[name]
    return getattr(importlib.import_module(f"{__package__}.{module}"), class_name)


def known_tracker_names() -> set[str]:
    return (set(_BUILTIN) - LOGGER_TYPE_TO_CLASS.removed) | set(_CUSTOM)


class _TrackerClasses(MutableMapping):
    """Accelerate's `LOGGER_TYPE_TO_CLASS`, live: the built-in trackers named by `LoggerType` (each class loaded
    when read) and the registered ones. Setting a name registers a class for `log_with`; deleting one removes it."""

    def __init__(self):
        self.removed: set[str] = set()  # built-ins deleted from the mapping

    def _builtins(self) -> list:
        return [n for n in _BUILTIN if n != "jsonl" and n not in self.removed and n not in _CUSTOM]

    def __getitem__(self, name):
        if name in _CUSTOM:
            return _CUSTOM[name]
        if name in self._builtins():
            return _builtin_class(name)
        raise KeyError(name)

    def __setitem__(self, name, tracker_class) -> None:
        self.removed.discard(name)
        if name in _BUILTIN and tracker_class is _builtin_class(name):
            _CUSTOM.pop(name, None)  # putting a built-in back (a saved copy restored) restores the built-in
        else:
            _CUSTOM[name] = tracker_class

    def __delitem__(self, name) -> None:
        if name not in self:
            raise KeyError(name)
        _CUSTOM.pop(name, None)
        if name in _BUILTIN:
            self.removed.add(name)

    def __iter__(self):
        yield from self._builtins()
        yield from _CUSTOM

    def __len__(self) -> int:
        return len(self._builtins()) + len(_CUSTOM)

    def __repr__(self) -> str:
        return repr(dict(self))


LOGGER_TYPE_TO_CLASS = _TrackerClasses()


def install_hint(name: str) -> str:
    extra = _BUILTIN.get(name, (None, None, None, None))[3]
    return f'pip install "hasten[{extra}]"' if extra else ""


def is_tracker_installed(name: str) -> bool:
    """True for custom trackers and for built-ins whose library can be imported (checked without importing it)."""
    name = _name_of(name)
    if name in _CUSTOM:
        return True
    if name not in known_tracker_names():  # a built-in deleted from LOGGER_TYPE_TO_CLASS
        return False
    library = _BUILTIN[name][2]
    return library is None or importlib.util.find_spec(library) is not None


def get_available_trackers() -> list:
    """Every built-in `LoggerType` whose library is installed."""
    from ..core.enums import LoggerType

    return [kind for kind in LoggerType if kind != LoggerType.ALL and is_tracker_installed(kind.value)]


def import_library(tracker_name: str, module: str = None):
    """Import a tracker's library, or raise ImportError with the pip command that installs it."""
    module = module or _BUILTIN[tracker_name][2]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"the {tracker_name!r} tracker needs the `{module}` library: {install_hint(tracker_name)}"
        ) from error


def _name_of(spec) -> str:
    return spec.value if isinstance(spec, enum.Enum) else str(spec)


# -- value conversion -------------------------------------------------------------------------------------


def to_plain(value):
    """A value every tracker library accepts: tensors/arrays become numbers or lists, enums their value,
    paths strings; dicts, lists and scalars are kept. Unknown objects become their `str`."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return to_plain(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(item) for item in value]
    tolist = getattr(value, "tolist", None)  # torch tensors, numpy arrays and numpy scalars
    if callable(tolist):
        try:
            return to_plain(tolist())
        except Exception:  # noqa: BLE001 - an odd array type falls back to str
            pass
    return str(value)


def flatten(values: Mapping, separator: str = "/", prefix: str = "") -> dict:
    """`{"optim": {"lr": 1}}` -> `{"optim/lr": 1}`; leaves go through `to_plain`."""
    flat = {}
    for key, value in values.items():
        name = f"{prefix}{separator}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, separator, name))
        else:
            flat[name] = to_plain(value)
    return flat


def simplify(value):
    """Single-element tensors/arrays and numpy scalars become Python numbers, enums their value; anything
    else (a library's media object, a list) is returned unchanged for the library to handle."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: simplify(item) for key, item in value.items()}
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (bool, int, float, str)):
        count = numel() if callable(numel) else numel
        if count == 1:
            return item()
    return value


def scalar_or_text(value):
    """A bool/int/float for numbers, else a string (lists, None, dicts become their text)."""
    value = to_plain(value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def is_number(value) -> bool:
    return isinstance(value, (int, float))  # bool included: trackers record it as 0/1
