"""`hasten tpu-config`: Accelerate's command for running setup commands on every worker of a TPU pod.

hasten has no TPU (torch_xla) backend, so the command takes Accelerate's flags (a typo is still reported
as a typo) and then refuses in one line instead of pretending to configure a pod.
"""

from __future__ import annotations

import argparse
import sys

from ..core.errors import NotSupportedYetError

REFUSAL = (
    "TPUs are not supported by hasten (it has no torch_xla backend); run your commands on the pod with "
    "`gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker all --command ...`, or use Accelerate for TPU training"
)


def tpu_command_parser(subparsers=None) -> argparse.ArgumentParser:
    description = "Run commands on every worker of a TPU pod (not supported by hasten: refuses with a reason)."
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=description)
    else:
        parser = argparse.ArgumentParser("hasten tpu-config", description=description, allow_abbrev=False)
    parser.add_argument("--config_file", "--config-file", default=None, help="Config file with the TPU settings.")
    parser.add_argument("--tpu_name", "--tpu-name", default=None, help="Name of the TPU.")
    parser.add_argument("--tpu_zone", "--tpu-zone", default=None, help="Zone of the TPU.")
    parser.add_argument("--use_alpha", "--use-alpha", action="store_true", help="Use `gcloud alpha`.")
    parser.add_argument("--command_file", "--command-file", default=None, help="File with one command per line.")
    parser.add_argument("--command", action="append", nargs="+", help="A command to run on each worker.")
    parser.add_argument("--install_accelerate", "--install-accelerate", action="store_true",
                        help="Install the library on each worker first.")
    parser.add_argument("--accelerate_version", "--accelerate-version", default="latest",
                        help="Version to install: latest, dev or a version number.")
    parser.add_argument("--debug", action="store_true", help="Print the command instead of running it.")
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def tpu_command_launcher(args):
    raise NotSupportedYetError(REFUSAL)


def main(argv=None) -> int:
    args = tpu_command_parser().parse_args(argv)
    try:
        tpu_command_launcher(args)
    except NotSupportedYetError as error:
        print(f"hasten tpu-config: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
