"""The mutants of scripts/prove_honoured.py, installed in every Python process of a mutation run.

scripts/prove_honoured.py copies this file as `sitecustomize.py` into a scratch folder it puts first on
PYTHONPATH, so the test process, `hasten launch` and every process it starts load it at interpreter start. It
imports nothing of hasten: when a target module has executed, it wraps the entry's one point of resolution:

- `setting:<name>`: `hasten.config.resolve.resolve` reports the row's default (source "default") whatever the
  code, flag, variable or file said, and a parsed command line holds the flag's default. The launcher then
  exports nothing for it, and the processes resolve the default too. Rows the precedence does not resolve are
  dropped where they are read instead: a key read only from the config file (a block, the TPU keys) is taken out
  of the file as read (`hasten.config.file.read_raw`), and a row's refusal (a feature not built) does not fire
  (`Setting.refusal` finds nothing to refuse), as if the user had not given it.
- `param:<callable>:<name>`: the callable is called as if the argument had not been passed (its default; a
  required one gets None). `*args` pass through unprepared; `**kwargs` are dropped.
- `field:<class>:<name>`: the class is built as if the field had not been given (its default).

That is the first kind of mutant, `drop` (HONOURED_KIND unset or "drop"). Two more kinds answer other bugs:

- `default`: the value given is replaced by the default while everything else stays, as a bug that overwrites a
  value with what it would have been anyway. A setting keeps its source (flag, variable, file) and takes the
  row's default, or the default the code computes where it computes one (`_COMPUTED`); a config-file-only key
  keeps its place in the file with the row's default; a parameter or field is passed its signature's default
  explicitly. A value that already equals the default is left alone (nothing to change: not a hit).
- `spelling`: `setting:<name>~<VARIABLE>` hides that one variable of a row with several names (HASTEN_X,
  ACCELERATE_X, ...) from the table's reader (`hasten.config.resolve._from_env`) and from the refusal of
  variables of features not built (`hasten.config.settings.refuse_unbuilt_environment`), the other spellings
  still read, as a bug that forgets one accepted name.

Which mutant is live is read at call time from HONOURED_MUTANT, so one test session can run many mutants one after
the other (and processes started meanwhile inherit the live one); HONOURED_TARGETS (JSON, written by the tool)
says what to wrap. When a mutant changes a call, the entry is appended to the file HONOURED_HITS, so the tool
can tell a test that never gave the value ("not reached") from one that ignored its loss ("survived").
Nothing here runs unless HONOURED_TARGETS is set; nothing of it is in src/hasten.
"""

import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import sys

_TARGETS = json.loads(os.environ.get("HONOURED_TARGETS") or "{}")  # entry -> [kind, module, qualname, parameter, *flag dests]
_KIND = os.environ.get("HONOURED_KIND") or "drop"  # drop, default or spelling: one kind for the whole run
_WRAPPED = {}  # id(original function) -> wrapper, to re-point names other modules imported
_DONE = set()


def _live(entry: str) -> bool:
    return os.environ.get("HONOURED_MUTANT") == entry


def _hit(entry: str) -> None:
    path = os.environ.get("HONOURED_HITS")
    if path:
        with open(path, "a") as out:
            out.write(entry + "\n")


def _drop(entry, function, parameter):
    """`function` called as if `parameter` had not been passed, while `entry` is live."""
    signature = inspect.signature(function)
    kind = signature.parameters[parameter].kind
    default = signature.parameters[parameter].default

    @functools.wraps(function)
    def mutant(*args, **kwargs):
        if not _live(entry):
            return function(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return function(*args, **kwargs)
        if parameter not in bound.arguments:
            return function(*args, **kwargs)
        if _KIND == "default" and default is not inspect.Parameter.empty:  # passed, explicitly, its default
            if _same(bound.arguments[parameter], default):
                return function(*args, **kwargs)
            _hit(entry)
            bound.arguments[parameter] = default
            return function(*bound.args, **bound.kwargs)
        _hit(entry)
        if kind is inspect.Parameter.VAR_POSITIONAL:  # prepare(*args): the objects come back untouched
            given = bound.arguments[parameter]
            return given[0] if len(given) == 1 else tuple(given)
        if kind is inspect.Parameter.VAR_KEYWORD or default is not inspect.Parameter.empty:
            del bound.arguments[parameter]
        else:
            bound.arguments[parameter] = None
        return function(*bound.args, **bound.kwargs)

    mutant.__signature__ = signature
    return mutant


def _same(value, default) -> bool:
    """Whether a given value already is the default (the default mutant then changes nothing)."""
    try:
        return bool(value is default or (type(value) is type(default) and value == default))
    except Exception:  # a tensor, an object with a strange __eq__: not the default
        return False


def _computed(name, result):
    """The default the code computes for row `name` where the table says None (None: the code computes none).

    `num_cpu_threads_per_process`: the launcher's threads per process (physical cores / processes per machine)."""
    if name == "num_cpu_threads_per_process":
        launch_settings = importlib.import_module("hasten.config.launch_settings")

        def value(row):
            found = result.get(row)
            return found.value if found is not None else None

        return launch_settings.default_threads(value("num_processes") or 1, value("num_machines") or 1)
    return None


def _parsed(entry, name, dests):
    """argparse's parse_known_args (parse_args calls it) with the row's flags back at their defaults: the launcher
    reads some flags from the parsed command line rather than through `resolve`. The default kind writes the row's
    default there as if typed (a row whose default is None or computed is left to `resolve`)."""
    import argparse

    original = argparse.ArgumentParser.parse_known_args

    @functools.wraps(original)
    def parse_known_args(self, *args, **kwargs):
        namespace, rest = original(self, *args, **kwargs)
        if _live(entry):
            for dest in dests:
                if not hasattr(namespace, dest) or getattr(namespace, dest) == self.get_default(dest):
                    continue
                if _KIND == "default":
                    table = sys.modules.get("hasten.config.settings")
                    row = table.BY_NAME.get(name) if table is not None else None
                    if row is None or row.default is None or getattr(namespace, dest) == row.default:
                        continue
                    _hit(entry)
                    setattr(namespace, dest, row.default)
                    continue
                _hit(entry)
                setattr(namespace, dest, self.get_default(dest))
        return namespace, rest

    argparse.ArgumentParser.parse_known_args = parse_known_args


def _setting(entry, module, name):
    original = module.resolve

    @functools.wraps(original)
    def resolve(*args, **kwargs):
        result = original(*args, **kwargs)
        found = result.get(name) if _live(entry) else None
        if found is not None and found.source != "default":
            default = (module.BY_NAME.get(name) or module.table.BY_NAME[name]).default  # variable-only rows too
            if _KIND == "default":  # the value overwritten by the default, its source kept
                default = _computed(name, result) if default is None else default
                if found.value == default:
                    return result
                _hit(entry)
                result[name] = module.Resolved(name, default, found.source, found.origin)
                return result
            _hit(entry)
            result[name] = module.Resolved(name, default, "default", "built-in default")
        return result

    module.resolve = resolve


def _unresolved(name) -> bool:
    """Whether the precedence leaves row `name` out (read from the file or the command line only, or not built)."""
    table = sys.modules.get("hasten.config.settings")
    row = table.BY_NAME.get(name) if table is not None else None
    return row is not None and (row.role != "setting" or not row.built)


def _refusal(entry, module, name):
    """`Setting.refusal` of row `name` finds nothing to refuse: the value the user gave is dropped, not refused."""
    original = module.Setting.refusal

    @functools.wraps(original)
    def refusal(self, *args, **kwargs):
        found = original(self, *args, **kwargs)
        if found is not None and self.name == name and _live(entry):
            _hit(entry)
            return None
        return found

    module.Setting.refusal = refusal


def _file(entry, module, name):
    """`read_raw` without row `name`'s key (a top-level key or a block's key), for rows only the file gives."""
    original = module.read_raw

    @functools.wraps(original)
    def read_raw(*args, **kwargs):
        data = original(*args, **kwargs)
        if not (_live(entry) and isinstance(data, dict) and _unresolved(name)):
            return data
        row = module.table.BY_NAME[name]
        *blocks, key = row.file_key or (None,)
        holder = data
        for block in blocks:
            holder = holder.get(block) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and key in holder:
            if _KIND == "default" and row.default is not None:  # the key stays, with the row's default
                if holder[key] != row.default:
                    _hit(entry)
                    holder[key] = row.default
                return data
            _hit(entry)
            del holder[key]
        return data

    module.read_raw = read_raw


def _spelling(entry, module, name, variable):
    """The table's reader of variables without `variable`, for row `name` only, while `entry` is live."""
    original = module._from_env

    @functools.wraps(original)
    def from_env(setting, env):
        if _live(entry) and setting.name == name and env.get(variable, "") != "":
            _hit(entry)
            env = {k: v for k, v in env.items() if k != variable}
        return original(setting, env)

    module._from_env = from_env


def _unbuilt_spelling(entry, module, name, variable):
    """The refusal of variables of features not built (`refuse_unbuilt_environment`) without `variable`."""
    original = module.refuse_unbuilt_environment

    @functools.wraps(original)
    def refuse_unbuilt_environment(env):
        if _live(entry) and env.get(variable, "") != "":
            _hit(entry)
            env = {k: v for k, v in env.items() if k != variable}
        return original(env)

    module.refuse_unbuilt_environment = refuse_unbuilt_environment


# Rows are also dropped where they are read around the precedence: module -> how (see the docstring). The refusal
# of a row not built has no default to fall back on, so only the drop kind lifts it.
_AROUND = {"drop": {"hasten.config.setting": _refusal, "hasten.config.file": _file},
           "default": {"hasten.config.file": _file},
           "spelling": {"hasten.config.settings": _unbuilt_spelling}}[_KIND]


def _apply(entry, module) -> None:
    kind, _, qualname, parameter, *dests = _TARGETS[entry]
    if kind == "spelling":
        _spelling(entry, module, parameter, dests[0])
        return
    if kind == "setting":
        _setting(entry, module, parameter)
        return
    owner_name, _, attribute = qualname.rpartition(".")
    if kind == "field":
        cls = getattr(module, qualname)
        cls.__init__ = _drop(entry, cls.__init__, parameter)
        return
    owner = getattr(module, owner_name) if owner_name else module
    original = inspect.getattr_static(owner, attribute)
    is_static = isinstance(original, staticmethod)
    function = original.__func__ if is_static else original
    wrapper = _drop(entry, function, parameter)
    setattr(owner, attribute, staticmethod(wrapper) if is_static else wrapper)
    if not owner_name:  # a function: names other modules already imported point at the mutant too
        _WRAPPED[id(function)] = wrapper
        for loaded in list(sys.modules.values()):
            _repoint(loaded)


def _repoint(module) -> None:
    if not _WRAPPED or not getattr(module, "__name__", "").startswith("hasten"):
        return
    for key, value in list(vars(module).items()):
        wrapper = _WRAPPED.get(id(value))
        if wrapper is not None and value is not wrapper:
            setattr(module, key, wrapper)


class _AfterExec(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds hasten's modules with the other finders, runs them, then applies the mutants aimed at them."""

    def __init__(self, loader):
        self.loader = loader

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith("hasten"):
            return None
        for finder in sys.meta_path:
            if finder is _AfterExec or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterExec(spec.loader)
                return spec
        return None

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for entry, (kind, target, _, parameter, *rest) in _TARGETS.items():
            if target == module.__name__ and entry not in _DONE:
                _DONE.add(entry)
                _apply(entry, module)
            if kind in ("setting", "spelling") and module.__name__ in _AROUND:
                _AROUND[module.__name__](entry, module, parameter, *(rest if kind == "spelling" else ()))
        _repoint(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self.loader, name)


if _TARGETS:
    sys.meta_path.insert(0, _AfterExec)
    for _entry, (_kind, _, _, _name, *_dests) in _TARGETS.items():
        if _kind == "setting" and _dests:  # at start: `hasten launch` parses its flags before it resolves anything
            _parsed(_entry, _name, _dests)
