"""`hasten alias install | remove | status`: let libraries that import `accelerate` (transformers' Trainer and
`from_pretrained(device_map=...)`, diffusers, peft, trl) run on hasten, in this Python environment only.

install writes these into site-packages, and remove deletes exactly those:
  _hasten_accelerate_alias.py     an import hook: `accelerate.X` is the module object `hasten.X`
                                  (`accelerate` itself: a view of hasten with Accelerate's version)
  hasten-accelerate-alias.pth     starts the hook in every interpreter of the environment
  accelerate-<version>.dist-info  package metadata, so `importlib.metadata.version("accelerate")` answers
                                  (transformers checks it) and pip sees the requirement as met; its RECORD
                                  lists the files above, so `pip uninstall accelerate` removes all of them.
and, into this interpreter's own site-packages only, Accelerate's console commands (`accelerate launch ...`, `accelerate-launch`,
...) next to the interpreter, each running the matching `hasten` command.

It refuses to install where a real Accelerate is installed: two packages answering to one name is the bug
this command must never create.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import shutil
import sys
import sysconfig

from ..core.errors import HastenError

ACCELERATE_VERSION = "1.15.0"  # the Accelerate release whose API hasten keeps
DIST_VERSION = f"{ACCELERATE_VERSION}+hasten"  # a local version: compatible, and visibly not the real one
HOOK_FILE = "_hasten_accelerate_alias.py"
PTH_FILE = "hasten-accelerate-alias.pth"
MARKER_FILE = "HASTEN_ALIAS"  # inside the dist-info: tells our metadata from a real Accelerate's


class AliasError(HastenError, RuntimeError):
    """The alias cannot be installed or removed here."""


def site_packages() -> str:
    """This interpreter's site-packages (the active virtual environment's, if any)."""
    return sysconfig.get_path("purelib")


def _dist_infos(site: str) -> list[str]:
    try:
        names = os.listdir(site)
    except FileNotFoundError:
        return []
    return [n for n in names if n.lower().startswith("accelerate-") and n.endswith((".dist-info", ".egg-info"))]


def _is_ours(site: str, dist_info: str) -> bool:
    return os.path.exists(os.path.join(site, dist_info, MARKER_FILE))


def _real_accelerate() -> str | None:
    """Where a real Accelerate is importable from in this interpreter, if anywhere (the hook is ignored)."""
    from importlib import metadata

    for dist in metadata.distributions(name="accelerate"):
        if dist.read_text(MARKER_FILE) is None:
            return f"accelerate {dist.version} ({dist.locate_file('')})"
    spec = importlib.machinery.PathFinder.find_spec("accelerate")
    if spec is not None:
        return f"the accelerate package at {spec.origin or list(spec.submodule_search_locations or [])[0]}"
    return None


def install(site: str | None = None) -> str:
    """Install the alias into `site` (default: this interpreter's site-packages); returns the folder."""
    site = site or site_packages()
    real = _real_accelerate()
    if real is not None:
        raise AliasError(
            f"a real Accelerate is installed here ({real}); hasten will not shadow it. Use a separate virtual "
            "environment for hasten, or `pip uninstall accelerate` first"
        )
    if not os.access(site, os.W_OK):
        raise AliasError(f"cannot write to {site}; run in a virtual environment you own (or with --target DIR)")
    for name in _dist_infos(site):  # an older alias of ours: replace it
        shutil.rmtree(os.path.join(site, name))
    hook_source = os.path.join(os.path.dirname(__file__), "alias_finder.py")
    shutil.copyfile(hook_source, os.path.join(site, HOOK_FILE))
    with open(os.path.join(site, PTH_FILE), "w", encoding="utf-8") as handle:
        # .pth lines that start with `import` run at interpreter start; this one only puts a finder on
        # sys.meta_path, which imports nothing until `accelerate` is imported.
        handle.write("import _hasten_accelerate_alias; _hasten_accelerate_alias.install()\n")
    dist_info = f"accelerate-{DIST_VERSION}.dist-info"
    folder = os.path.join(site, dist_info)
    os.makedirs(folder)
    from .. import __version__ as hasten_version

    files = {
        "METADATA": (
            "Metadata-Version: 2.1\nName: accelerate\n"
            f"Version: {DIST_VERSION}\n"
            f"Summary: Alias of hasten {hasten_version} under Accelerate's name (`hasten alias remove` undoes it)\n"
            "Requires-Dist: hasten\n"
        ),
        "INSTALLER": "hasten-alias\n",
        MARKER_FILE: f"hasten {hasten_version}\n",
        "top_level.txt": "accelerate\n",
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    scripts = _write_commands(site) if site == site_packages() else []
    record = [HOOK_FILE, PTH_FILE, *scripts, *(f"{dist_info}/{name}" for name in files), f"{dist_info}/RECORD"]
    with open(os.path.join(folder, "RECORD"), "w", encoding="utf-8") as handle:
        handle.writelines(f"{path},,\n" for path in record)
    return site


# Accelerate's console commands -> the hasten command they run (`accelerate launch ...` = `hasten launch ...`)
COMMANDS = {"accelerate": [], "accelerate-launch": ["launch"], "accelerate-config": ["config"],
            "accelerate-merge-weights": ["merge-weights"], "accelerate-estimate-memory": ["estimate-memory"]}


def _write_commands(site: str) -> list[str]:
    """Write Accelerate's console commands next to this interpreter; returns their paths relative to `site`."""
    folder = sysconfig.get_path("scripts")
    written = []
    for name, prefix in COMMANDS.items():
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"#!{sys.executable}\n# written by `hasten alias install`\nimport sys\n"
                         "from hasten.commands.cli import main\n"
                         f"sys.exit(main({prefix!r} + sys.argv[1:]))\n")
        os.chmod(path, 0o755)
        written.append(os.path.relpath(path, site))
    return written


def _remove_commands() -> None:
    folder = sysconfig.get_path("scripts")
    for name in COMMANDS:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as handle:
                ours = "written by `hasten alias install`" in handle.read(300)
        except (OSError, UnicodeDecodeError):
            continue
        if ours:
            os.remove(path)


def remove(site: str | None = None) -> bool:
    """Remove the alias from `site`; returns whether there was one. Never touches a real Accelerate."""
    site = site or site_packages()
    found = False
    for name in _dist_infos(site):
        if not _is_ours(site, name):
            raise AliasError(f"{os.path.join(site, name)} belongs to a real Accelerate; remove it with pip, not hasten")
        shutil.rmtree(os.path.join(site, name))
        found = True
    cache = os.path.join(site, "__pycache__")
    compiled = [os.path.join("__pycache__", n) for n in (os.listdir(cache) if os.path.isdir(cache) else ())
                if n.startswith(HOOK_FILE[:-3] + ".")]
    if site == site_packages():
        _remove_commands()
    for name in (PTH_FILE, HOOK_FILE, *compiled):
        path = os.path.join(site, name)
        if os.path.exists(path):
            os.remove(path)
            found = True
    return found


def alias_status() -> str:
    """One line for `hasten env`: whether `import accelerate` gives hasten in this interpreter, and why not."""
    site = site_packages()
    installed = os.path.exists(os.path.join(site, PTH_FILE))
    hooked = any(type(finder).__name__ == "AccelerateAliasFinder" for finder in sys.meta_path)
    real = _real_accelerate()
    if real is not None:
        state = "inactive: a real Accelerate is installed" + (" and wins over the alias" if installed else "")
        return f"{state} ({real})"
    if installed and hooked:
        return f"active: `import accelerate` loads hasten (metadata version {DIST_VERSION}; in {site})"
    if installed:
        return f"installed in {site} but not started in this interpreter (was it started with -S or -I?)"
    return "not installed (`hasten alias install` lets transformers and other libraries use hasten)"


def alias_parser(subparsers=None) -> argparse.ArgumentParser:
    description = "Let `import accelerate` load hasten in this environment (for transformers, diffusers, peft, trl)."
    if subparsers is not None:
        parser = subparsers.add_parser("alias", description=description)
    else:
        parser = argparse.ArgumentParser("hasten alias", description=description, allow_abbrev=False)
    parser.add_argument("action", choices=["install", "remove", "status"])
    parser.add_argument("--target", default=None,
                        help="site-packages folder to change (default: this interpreter's, %(default)s)")
    return parser


def main(argv=None) -> int:
    args = alias_parser().parse_args(argv)
    try:
        if args.action == "install":
            site = install(args.target)
            print(f"Installed: `import accelerate` now loads hasten in every Python of {site}. "
                  "Undo with `hasten alias remove`.")
        elif args.action == "remove":
            site = args.target or site_packages()
            print(f"Removed the accelerate alias from {site}." if remove(args.target) else f"No alias in {site}.")
        else:
            print(f"accelerate alias: {alias_status()}")
    except (AliasError, OSError) as error:
        print(f"hasten alias: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
