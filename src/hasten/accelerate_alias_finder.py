"""The import hook behind `hasten alias install`: `import accelerate.X` returns the module object `hasten.X`.

`hasten alias install` copies this file into site-packages (as `_hasten_accelerate_alias.py`) next to a
`.pth` line that imports it and calls `install()` at interpreter start. It must stay standard-library only and cheap: it runs in
every Python process of the environment and imports nothing until `accelerate` itself is imported.
"""

import sys

ALIAS, TARGET = "accelerate", "hasten"


# Plain classes (not importlib.abc subclasses) and imports inside the methods: at interpreter start this
# module then costs one small file read, not the ~20 ms that importing importlib.abc/util takes.
class _SameModuleLoader:
    """Hands the import system the already imported hasten module, so both names share one object."""

    def __init__(self, target_name):
        self.target_name = target_name

    def create_module(self, spec):
        import importlib

        return importlib.import_module(self.target_name)

    def exec_module(self, module):
        pass  # executed when it was imported as hasten.X


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
        return importlib.util.spec_from_loader(fullname, _SameModuleLoader(target_name), is_package=is_package)


def install():
    """Put the finder first on sys.meta_path (once)."""
    if not any(type(finder).__name__ == "AccelerateAliasFinder" for finder in sys.meta_path):
        sys.meta_path.insert(0, AccelerateAliasFinder())
