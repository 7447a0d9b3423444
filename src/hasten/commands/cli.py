"""The `hasten` command: dispatches `hasten <command> ...` to the module that implements the command."""

from __future__ import annotations

import importlib
import sys

# command -> (module, one-line help). Each module has `main(argv) -> int`.
COMMANDS = {
    "launch": ("hasten.commands.launch", "Launch a script on one or more processes and machines."),
    "env": ("hasten.commands.env", "Print versions, platform, devices and config, for bug reports."),
    "config": ("hasten.commands.config", "Write, update or explain the config file (`hasten config` asks questions)."),
    "test": ("hasten.commands.test", "Run a short self-check of distributed training with your configuration."),
    "estimate-memory": ("hasten.commands.estimate", "Estimate a model's memory for inference and training."),
    "merge-weights": ("hasten.commands.merge_weights", "Merge a sharded FSDP checkpoint into model.safetensors."),
    "to-fsdp2": ("hasten.commands.to_fsdp2", "Rewrite a config file's FSDP1 settings for FSDP2."),
    "tpu-config": ("hasten.commands.tpu", "Run setup commands on every worker of a Cloud TPU pod (through gcloud)."),
    "alias": ("hasten.commands.alias", "Let `import accelerate` load hasten (install/remove/status), for transformers."),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: hasten <command> [<args>]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `hasten <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 1
    name = argv[0].replace("_", "-")
    if name not in COMMANDS:
        print(f"hasten: unknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
