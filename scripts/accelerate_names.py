"""Write the list of Accelerate 1.15.0's public names that hasten must offer at the same paths.

Run once, with accelerate==1.15.0 installed (the `bench` extra), to regenerate the checked-in list:

    .venv/bin/python scripts/accelerate_names.py > tests/fixtures/accelerate_public_names.txt

or point it at the package folder of Accelerate 1.15.0's sdist (`pip download --no-deps --no-binary :all:
accelerate==1.15.0`, untarred): `scripts/accelerate_names.py path/to/accelerate-1.15.0/src/accelerate`.

Only names are read, from the source files' syntax trees; nothing of Accelerate is imported, so
names bound under a condition (`if is_deepspeed_available(): from .deepspeed import ...`) count too.

What is listed, one entry a line, `accelerate` already renamed to `hasten`:
- `module` lines: every public module path (all modules of the package except the bundled test
  scripts under `test_utils/scripts` and the terminal-menu internals under `commands/menu`);
- `module:name` lines for
  - every name a package `__init__` binds (`hasten:Accelerator`, `hasten.utils:gather`, ...);
  - the same name at the module it comes from (`hasten.utils.operations:gather`), since users
    import from both;
  - every public name defined at the top level of every module (`hasten.checkpointing:save_accelerator_state`,
    `hasten.utils.other:get_free_port`, `hasten.commands.launch:launch_command`, ...), minus loggers.
"""

from __future__ import annotations

import ast
import pathlib
import sys

VERSION = "1.15.0"
SKIPPED_PACKAGES = ("test_utils.scripts", "commands.menu")
NOT_NAMES = {"logger"}  # module-level loggers are not API


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _skipped(module: str) -> bool:
    inner = module.partition(".")[2]
    return any(inner == p or inner.startswith(p + ".") for p in SKIPPED_PACKAGES)


def _resolve(package: str, level: int, target: str | None) -> str:
    base = package.split(".")
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join(base + ([target] if target else []))


def _top_level_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_") and n not in NOT_NAMES]


def collect(root: pathlib.Path) -> list[str]:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        if not _skipped(module):
            modules[module] = path
    entries = set(modules)
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        if is_package:
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.level >= 1):
                    continue
                source = _resolve(module, node.level, node.module)
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if bound.startswith("_") or f"{source}.{alias.name}" in modules or _skipped(f"{source}.{alias.name}"):
                        continue  # private, or a submodule (listed as a module path)
                    entries.add(f"{module}:{bound}")
                    if source in modules:
                        entries.add(f"{source}:{alias.name}")
            entries.update(f"{module}:{name}" for name in _top_level_names(tree))
        else:
            entries.update(f"{module}:{name}" for name in _top_level_names(tree))
    return sorted(e.replace("accelerate", "hasten", 1) for e in entries)


def main() -> None:
    import importlib.metadata
    import importlib.util

    if len(sys.argv) > 1:
        root = pathlib.Path(sys.argv[1])
        if f'__version__ = "{VERSION}"' not in (root / "__init__.py").read_text():
            sys.exit(f"{root} is not Accelerate {VERSION}'s package folder")
    else:
        installed = importlib.metadata.version("accelerate")
        if installed != VERSION:
            sys.exit(f"accelerate {installed} is installed; this list is for {VERSION}: pip install "
                     f"accelerate=={VERSION}")
        root = pathlib.Path(importlib.util.find_spec("accelerate").origin).parent
    print(f"# Accelerate {VERSION}'s public names at hasten's paths; written by scripts/accelerate_names.py")
    print("\n".join(collect(root)))


if __name__ == "__main__":
    main()
