"""`hasten tpu-config`: run setup commands on every worker of a Cloud TPU pod, through `gcloud`, as Accelerate's
`accelerate tpu-config` does.

The command only composes one `gcloud compute tpus tpu-vm ssh NAME --zone ZONE --command "..." --worker all` line
and runs it (or prints it, with `--debug`), so it works the same on any machine. Training on TPUs is another
matter: hasten has no torch_xla backend, and `hasten launch --tpu` (or `distributed_type: XLA`) is refused.

The TPU name, zone and commands come from the flags, else from the config file (`tpu_name`, `tpu_zone`,
`commands`, `command_file`). `--install_accelerate` installs Accelerate on the workers, with Accelerate's own
command text: the workers train on TPUs, which needs Accelerate. `--install_hasten` (hasten's addition) installs
hasten there instead or as well.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

from ..config import file as config_file
from ..core.errors import ConfigError

_DESCRIPTION = "Run commands on every worker of a Cloud TPU pod (through gcloud) before launching there."
_ACCELERATE_DEV = "git+https://github.com/huggingface/accelerate.git"


def tpu_command_parser(subparsers=None) -> argparse.ArgumentParser:
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=_DESCRIPTION)
    else:
        parser = argparse.ArgumentParser("hasten tpu-config", description=_DESCRIPTION, allow_abbrev=False)
    config = parser.add_argument_group("Config arguments", "Each also read from the config file when not given.")
    config.add_argument("--config_file", "--config-file", default=None,
                        help="Config file to read tpu_name, tpu_zone, commands and command_file from (default: the "
                             "default config file, when there is one).")
    config.add_argument("--tpu_name", "--tpu-name", default=None, help="Name of the TPU (else the file's tpu_name).")
    config.add_argument("--tpu_zone", "--tpu-zone", default=None, help="Zone of the TPU (else the file's tpu_zone).")
    pod = parser.add_argument_group("TPU arguments", "What runs on the workers.")
    pod.add_argument("--use_alpha", "--use-alpha", action="store_true", help="Run `gcloud alpha ...`.")
    pod.add_argument("--command_file", "--command-file", default=None,
                     help="File with the commands to run on every worker, one a line.")
    pod.add_argument("--command", action="append", nargs="+",
                     help="A command to run on every worker; may be repeated.")
    pod.add_argument("--install_accelerate", "--install-accelerate", action="store_true",
                     help="pip install Accelerate on the workers first (TPU training needs it: hasten has no TPU "
                          "backend).")
    pod.add_argument("--accelerate_version", "--accelerate-version", default="latest",
                     help="Accelerate version to install: latest, dev (from GitHub) or a version number.")
    pod.add_argument("--install_hasten", "--install-hasten", action="store_true",
                     help="pip install hasten on the workers first (hasten only).")
    pod.add_argument("--hasten_version", "--hasten-version", default="latest",
                     help="hasten version to install: latest or a version number (hasten only).")
    pod.add_argument("--debug", action="store_true", help="Print the gcloud command instead of running it.")
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def _requirement(package: str, version: str, dev: str | None = None) -> str:
    """What follows `pip install`: `pkg -U` for latest, the GitHub source for dev, `pkg==X` for a version
    number, and any other text (a path, a URL, `pkg>=1`) as given."""
    from packaging.version import InvalidVersion, Version

    if version == "latest":
        return f"{package} -U"
    if version == "dev":
        if dev is None:
            raise ConfigError(f"--{package}_version dev: {package} has no development source to install from; fix: "
                              "pass latest, a version number, or a path or URL pip can install")
        return dev
    try:
        Version(version)
    except InvalidVersion:
        return version
    return f"{package}=={version}"


def _file_values(path: str | None) -> dict:
    """The config file's keys (only those it sets), checked; None: the default file, when there is one.
    Settings hasten cannot train with (`distributed_type: XLA`) are not refused here: this command trains nothing."""
    found = config_file.find_config_file(path)
    if found is None:
        return {}
    return config_file.validate(config_file.read_raw(found), found, fill_defaults=False, refuse_unbuilt=False)


def _commands(args, defaults: dict) -> list:
    """The commands to run, one string each, in Accelerate's order: --command_file, else --command (the words of
    one --command make one command), else the file's `command_file`, else its `commands`."""
    command_file = args.command_file or (None if args.command else defaults.get("command_file"))
    if command_file:
        try:
            with open(command_file, encoding="utf-8") as handle:
                return handle.read().splitlines()
        except OSError as error:
            raise ConfigError(f"command file {command_file!r} cannot be read ({error.strerror}); fix: pass an "
                              "existing file to --command_file") from None
    if args.command:
        return [" ".join(words) if isinstance(words, list) else str(words) for words in args.command]
    listed = defaults.get("commands")
    if listed:
        return [listed] if isinstance(listed, str) else [str(item) for item in listed]
    raise ValueError("You must specify either a command file or a command to run on the pod. (pass --command or "
                     "--command_file, or set `commands:` or `command_file:` in the config file)")


def tpu_gcloud_command(args) -> list:
    """The `gcloud` command (a list of arguments) that `tpu_command_launcher` runs for `args`."""
    defaults = _file_values(args.config_file)
    name = args.tpu_name or defaults.get("tpu_name")
    zone = args.tpu_zone or defaults.get("tpu_zone")
    commands = _commands(args, defaults)
    missing = [flag for flag, value in (("--tpu_name", name), ("--tpu_zone", zone)) if not value]
    if missing:
        raise ConfigError(f"no TPU {' and '.join(m[6:] for m in missing)} given; fix: pass {' and '.join(missing)}, "
                          "or set `tpu_name:` and `tpu_zone:` in the config file")
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_requirement('accelerate', args.accelerate_version, _ACCELERATE_DEV)}")
    if getattr(args, "install_hasten", False):
        steps.append(f"pip install {_requirement('hasten', getattr(args, 'hasten_version', 'latest'))}")
    steps += commands
    gcloud = ["gcloud", *(["alpha"] if args.use_alpha else [])]
    return [*gcloud, "compute", "tpus", "tpu-vm", "ssh", name, "--zone", zone, "--command", "; ".join(steps),
            "--worker", "all"]


def tpu_command_launcher(args) -> None:
    """Run the commands on every worker of the pod (with `--debug`, print the gcloud command instead)."""
    command = tpu_gcloud_command(args)
    if args.debug:
        print(f"Running {' '.join(command)}")  # Accelerate's words; `shlex.join` below for a shell
        return
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError:
        raise ConfigError("gcloud is not installed or not on PATH; fix: install the Google Cloud CLI "
                          f"(https://cloud.google.com/sdk/docs/install), or run: {shlex.join(command)}") from None
    print("Successfully setup pod.")


def main(argv=None) -> int:
    args = tpu_command_parser().parse_args(argv)
    try:
        tpu_command_launcher(args)
    except subprocess.CalledProcessError as error:
        print(f"hasten tpu-config: gcloud failed with exit code {error.returncode} (its output is above)",
              file=sys.stderr)
        return error.returncode or 1
    except (ConfigError, ValueError) as error:
        print(f"hasten tpu-config: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
