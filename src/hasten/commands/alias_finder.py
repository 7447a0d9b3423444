"""The import hook behind `hasten alias install`: `import accelerate.X` returns the module object `hasten.X`.

The top-level `accelerate` is the one exception: a view of `hasten` whose every attribute is hasten's (read, set
and deleted there, so one `Accelerator`, one `PartialState`, and `mock.patch("accelerate.x")` reaches hasten)
except `__version__`, which is the Accelerate release whose API hasten keeps. Libraries compare it
(transformers' Trainer: `accelerate.__version__ > "1.3.0"`), and hasten's own number would send them down
code paths for an Accelerate years old.

`hasten alias install` copies this file into site-packages (as `_hasten_accelerate_alias.py`) next to a
`.pth` line that imports it and calls `install()` at interpreter start. It must stay standard-library only and cheap: it runs in
every Python process of the environment and imports nothing until `accelerate` itself is imported.
"""

import sys

ALIAS, TARGET = "accelerate", "hasten"
ALIAS_VERSION = "1.15.0+hasten"  # as the alias's dist-info says
# The view's own attributes (the import system sets the dunders); every other name is hasten's.
_OWN = frozenset({"__name__", "__loader__", "__package__", "__spec__", "__path__", "__file__", "__cached__",
                  "__version__", "__doc__", "__builtins__"})


# Plain classes (not importlib.abc subclasses) and imports inside the methods: at interpreter start this
# module then costs one small file read, not the ~20 ms that importing importlib.abc/util takes.
class _SameModuleLoader:
    """Hands the import system the already imported hasten module, so both names share one object."""

    def __init__(self, target_name):
        self.target_name = target_name

    def create_module(self, spec):
        import importlib

        module = importlib.import_module(self.target_name)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # Executed when it was imported as hasten.X. The import system has just stamped the alias's spec on
        # the shared module; put hasten's back, or `__spec__.parent` ("accelerate...") disagrees with
        # `__package__` ("hasten...") and every relative import run inside a function warns (ImportWarning).
        own_spec = getattr(self, "own_spec", None)
        if own_spec is not None:
            module.__spec__ = own_spec


class _PackageViewLoader(_SameModuleLoader):
    def create_module(self, spec):
        import importlib
        import types

        target = importlib.import_module(self.target_name)

        class AcceleratePackage(types.ModuleType):
            """`accelerate`: hasten under Accelerate's name and version (see the module docstring)."""

            def __getattr__(self, name):
                return getattr(target, name)

            def __setattr__(self, name, value):
                if name in _OWN:
                    types.ModuleType.__setattr__(self, name, value)
                else:
                    setattr(target, name, value)

            def __delattr__(self, name):
                if name in _OWN:
                    types.ModuleType.__delattr__(self, name)
                else:
                    delattr(target, name)

            def __dir__(self):
                return sorted(set(dir(target)) | {"__version__"})

        _share_loggers()
        view = AcceleratePackage(ALIAS, target.__doc__)
        view.__version__ = ALIAS_VERSION
        view.__file__ = getattr(target, "__file__", None)
        return view


def _share_loggers():
    """`logging.getLogger("accelerate.X")` returns hasten's logger `hasten.X` (and "accelerate" returns "hasten").

    Code written for Accelerate captures or silences Accelerate's records by logger name
    (`assertLogs("accelerate.utils.environment")`, `getLogger("accelerate").setLevel(...)`); hasten's records go
    to its own loggers, so the name is translated where every lookup passes, the logging manager. Installed when
    `accelerate` is first imported, never at interpreter start; a logger someone made under an `accelerate` name
    before that keeps its object but is no longer returned by name.
    """
    import logging

    manager = logging.Logger.manager
    if getattr(manager, "_hasten_alias_names", False):
        return
    own_get_logger = manager.getLogger

    def get_logger(name):
        if isinstance(name, str) and (name == ALIAS or name.startswith(ALIAS + ".")):
            name = TARGET + name[len(ALIAS):]
        return own_get_logger(name)

    manager.getLogger = get_logger
    manager._hasten_alias_names = True


class AccelerateAliasFinder:
    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        import importlib.machinery
        import importlib.util

        if fullname == ALIAS and importlib.machinery.PathFinder.find_spec(ALIAS) is not None:
            return None  # a real Accelerate was installed after the alias: it wins
        target_name = TARGET + fullname[len(ALIAS):]
        loaded = sys.modules.get(target_name)
        if loaded is not None:
            is_package = hasattr(loaded, "__path__")
        else:
            try:
                found = importlib.util.find_spec(target_name)
            except (ImportError, ValueError):
                return None
            if found is None:
                return None  # a module hasten does not have: the usual "No module named 'accelerate.X'"
            is_package = found.submodule_search_locations is not None
        loader = _PackageViewLoader(target_name) if fullname == ALIAS else _SameModuleLoader(target_name)
        return importlib.util.spec_from_loader(fullname, loader, is_package=is_package)


def install():
    """Put the finder first on sys.meta_path (once)."""
    if not any(type(finder).__name__ == "AccelerateAliasFinder" for finder in sys.meta_path):
        sys.meta_path.insert(0, AccelerateAliasFinder())
