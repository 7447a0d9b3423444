"""`hasten config`: write a config file by answering questions, or non-interactively; update it; explain it.

    hasten config [--config_file PATH]              questionnaire (numbered choices, defaults from this machine)
    hasten config default [--config_file PATH] [--mixed_precision bf16]
    hasten config update [--config_file PATH]       re-check and rewrite in the current form
    hasten config explain [launch flags...]         every value `hasten launch` would use, and its source
"""

from __future__ import annotations

import argparse
import os
import sys

from ..config import file as config_file
from ..environment import parse_int
from ..errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _Cancelled(Exception):
    pass


# ----------------------------------------------------------------------------------------------- questions


class Questions:
    """Ask on stdin/stdout; a blank answer takes the default; a bad answer is asked again (a few times)."""

    ATTEMPTS = 5

    def __init__(self, read=input, write=print):
        self._read, self._write = read, write

    def _answer(self, prompt: str) -> str:
        try:
            return self._read(prompt).strip()
        except EOFError:
            raise ConfigError(
                "the questionnaire ended before all questions were answered (no more input); fix: run it in a "
                "terminal, or use `hasten config default` for a non-interactive config"
            ) from None
        except KeyboardInterrupt:
            raise _Cancelled from None

    def ask(self, question: str, default, parse=str):
        shown = "" if default is None else f" [{_show(default)}]"
        for _ in range(self.ATTEMPTS):
            text = self._answer(f"{question}{shown}: ")
            if not text:
                if default is not None:
                    return default
                self._write("  Please give an answer.")
                continue
            try:
                return parse(text)
            except ValueError as error:
                self._write(f"  {error}")
        raise ConfigError(f"no valid answer to {question!r} after {self.ATTEMPTS} tries")

    def yes_no(self, question: str, default: bool = False) -> bool:
        from ..environment import str_to_bool

        def parse(text):
            try:
                return str_to_bool(text, to_bool=True)
            except ValueError:
                raise ValueError("answer yes or no") from None

        return self.ask(f"{question} (yes/no)", default, parse)

    def choose(self, question: str, options, default: int = 0):
        """Numbered choices; returns the chosen option's value. `options` are (value, label) pairs."""
        self._write(question)
        for index, (_, label) in enumerate(options):
            self._write(f"  [{index}] {label}")

        def parse(text):
            if text.isdigit() and int(text) < len(options):
                return options[int(text)][0]
            for value, label in options:
                if text.lower() in (str(value).lower(), label.lower()):
                    return value
            raise ValueError(f"answer a number from 0 to {len(options) - 1}")

        for _ in range(self.ATTEMPTS):
            text = self._answer(f"Your choice [{default}]: ")
            if not text:
                return options[default][0]
            try:
                return parse(text)
            except ValueError as error:
                self._write(f"  {error}")
        raise ConfigError(f"no valid answer to {question!r} after {self.ATTEMPTS} tries")


def _show(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _at_least(minimum):
    return lambda text: parse_int(text, minimum)


def _port(text):
    value = _at_least(0)(text)
    if value > 65535:
        raise ValueError("a TCP port is 0-65535")
    return value


def _gpu_ids(text):
    text = text.replace(" ", "")
    if text.lower() == "all" or all(part.isdigit() for part in text.split(",")):
        return text.lower() if text.lower() == "all" else text
    raise ValueError("answer 'all' or comma-separated ids such as 0,1")


def questionnaire(questions: Questions, machine: dict, existing: dict | None = None) -> dict:
    """The config a user builds by answering; defaults come from this machine (and an existing file)."""
    existing = existing or {}
    count, device = machine["device_count"], machine["device"]
    has_gpu = device != "cpu" and count > 0
    kinds = [("NO", "No distributed training (one process)"), ("MULTI_CPU", "Several CPU processes")]
    if has_gpu:
        kinds += [("MULTI_GPU", f"Several GPUs, one process each ({count} {device} found)"),
                  ("FSDP", "Several GPUs with the model sharded (FSDP)")]
    values = [k for k, _ in kinds]
    start = existing.get("distributed_type") or ("MULTI_GPU" if has_gpu and count > 1 else "NO")
    kind = questions.choose("Which kind of run is this machine for?", kinds, values.index(start) if start in values else 0)

    config = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind}
    config["use_cpu"] = kind in ("NO", "MULTI_CPU") and (not has_gpu or questions.yes_no(
        "Run on CPU only, even though a GPU is present?", bool(existing.get("use_cpu", False))))
    if kind == "NO":
        config["num_processes"] = 1
    else:
        machines = questions.ask("How many machines (nodes) take part?", existing.get("num_machines", 1), _at_least(1))
        config["num_machines"] = machines
        if machines > 1:
            config["machine_rank"] = questions.ask(
                f"Rank of this machine (0 to {machines - 1}; 0 is the main one)", existing.get("machine_rank", 0),
                lambda t: _rank(t, machines))
            config["main_process_ip"] = questions.ask(
                "Address (IP or host name) of the machine with rank 0", existing.get("main_process_ip"), str)
            config["main_process_port"] = questions.ask(
                "Port on the main machine", existing.get("main_process_port", 29500), _port)
            config["rdzv_backend"] = questions.choose(
                "How should the machines meet (rendezvous)?",
                [("static", "static: fixed machine ranks"), ("c10d", "c10d: torchrun's elastic rendezvous")],
                0 if existing.get("rdzv_backend", "static") == "static" else 1)
            config["same_network"] = questions.yes_no("Are all machines on the same network?",
                                                      bool(existing.get("same_network", True)))
        per_machine = count if has_gpu and kind != "MULTI_CPU" else 2
        default_total = existing.get("num_processes") if existing.get("num_processes", -1) > 0 else per_machine * machines
        config["num_processes"] = questions.ask(
            "How many processes in total, over all machines?", default_total,
            lambda t: _total(t, machines))
        if kind in ("MULTI_GPU", "FSDP"):
            config["gpu_ids"] = questions.ask("Which GPUs (ids) should be used?", existing.get("gpu_ids", "all"), _gpu_ids)
    if kind == "FSDP":
        config["fsdp_config"] = _fsdp_questions(questions, existing.get("fsdp_config") or {})
    if questions.yes_no("Compile the model with torch.compile (dynamo)?",
                        (existing.get("dynamo_config") or {}).get("dynamo_backend", "no") != "no"):
        backend = questions.choose("Which torch.compile backend?",
                                   [("inductor", "inductor (default)"), ("eager", "eager"), ("aot_eager", "aot_eager"),
                                    ("cudagraphs", "cudagraphs")], 0)
        mode = questions.choose("Which mode?", [(m, m) for m in config_file.DYNAMO_MODES], 0)
        config["dynamo_config"] = {"dynamo_backend": backend, "dynamo_mode": mode,
                                   "dynamo_use_fullgraph": questions.yes_no("Refuse graph breaks (fullgraph)?", False),
                                   "dynamo_use_dynamic": questions.yes_no("Use dynamic shapes?", False)}
    if kind != "NO":
        config["debug"] = questions.yes_no("Check tensor shapes across processes before collectives (debug mode)?",
                                           bool(existing.get("debug", False)))
    precisions = [("no", "no (fp32)"), ("fp16", "fp16"), ("bf16", "bf16"), ("fp8", "fp8")]
    current = existing.get("mixed_precision", "no")
    config["mixed_precision"] = questions.choose(
        "Which mixed precision?", precisions, [p for p, _ in precisions].index(current) if current in dict(precisions) else 0)
    return config


def _rank(text, machines):
    value = _at_least(0)(text)
    if value >= machines:
        raise ValueError(f"give 0 to {machines - 1}")
    return value


def _total(text, machines):
    value = _at_least(1)(text)
    if value % machines:
        raise ValueError(f"the total must divide evenly over {machines} machines")
    return value


def _fsdp_questions(questions: Questions, existing: dict) -> dict:
    version = questions.choose("Which FSDP?", [(2, "FSDP2 (fully_shard, recommended)"), (1, "FSDP1")],
                               0 if existing.get("fsdp_version", 2) == 2 else 1)
    fsdp = {"fsdp_version": version}
    fsdp["fsdp_reshard_after_forward"] = questions.yes_no(
        "Free gathered parameters after forward (less memory, more communication)?",
        existing.get("fsdp_reshard_after_forward", True) is not False)
    fsdp["fsdp_offload_params"] = questions.yes_no("Keep parameters on CPU (offload)?",
                                                   bool(existing.get("fsdp_offload_params", False)))
    policy = questions.choose("How should the model be split into shards?",
                              [("TRANSFORMER_BASED_WRAP", "by transformer layer class"),
                               ("SIZE_BASED_WRAP", "by parameter count"), ("NO_WRAP", "one shard group")], 0)
    fsdp["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = questions.ask(
            "Layer class names to wrap (comma-separated; blank: read from the model)",
            existing.get("fsdp_transformer_layer_cls_to_wrap", ""), str) or None
    elif policy == "SIZE_BASED_WRAP":
        fsdp["fsdp_min_num_params"] = questions.ask("Minimum parameters per shard group",
                                                    existing.get("fsdp_min_num_params", 100_000_000), _at_least(0))
    fsdp["fsdp_state_dict_type"] = questions.choose(
        "How should checkpoints be saved?",
        [("SHARDED_STATE_DICT", "sharded (each rank its part)"), ("FULL_STATE_DICT", "full (one file on rank 0)")], 0)
    fsdp["fsdp_cpu_ram_efficient_loading"] = questions.yes_no(
        "Load pretrained weights on rank 0 only (saves CPU memory)?", bool(existing.get("fsdp_cpu_ram_efficient_loading", False)))
    if fsdp["fsdp_cpu_ram_efficient_loading"]:
        fsdp["fsdp_sync_module_states"] = True
    fsdp["fsdp_activation_checkpointing"] = questions.yes_no(
        "Recompute activations in backward (activation checkpointing)?", bool(existing.get("fsdp_activation_checkpointing", False)))
    return {k: v for k, v in fsdp.items() if v is not None}


# ----------------------------------------------------------------------------------------------- commands


ASKED_KEYS = {
    "compute_environment", "distributed_type", "use_cpu", "num_processes", "num_machines", "machine_rank",
    "main_process_ip", "main_process_port", "rdzv_backend", "same_network", "gpu_ids", "fsdp_config",
    "dynamo_config", "debug", "mixed_precision",
}


def _interactive(args) -> int:
    path = args.config_file or config_file.default_config_path()
    existing, kept = {}, {}
    if os.path.isfile(path):
        existing = config_file.load_config_file(path)
        # Settings the questions do not cover (max_restarts, rdzv_conf, ...) survive an edit.
        kept = {k: v for k, v in config_file.load_config_file(path, fill_defaults=False).items()
                if k not in ASKED_KEYS}
        print(f"Editing {path}; press Enter to keep a value.")
    try:
        config = questionnaire(Questions(), config_file.detect_machine(), existing)
    except _Cancelled:
        print("\nhasten config: cancelled; nothing was written", file=sys.stderr)
        return 1
    config_file.write_config_file({**kept, **config}, path)
    print(f"hasten config: wrote {path}")
    return 0


def _default(args) -> int:
    path = args.config_file or config_file.default_config_path()
    written = config_file.write_basic_config(args.mixed_precision, path)
    if not written:
        return 1
    print(f"hasten config: wrote {written}")
    return 0


def _update(args) -> int:
    path = args.config_file or config_file.find_config_file(None)
    if path is None:
        raise ConfigError(
            f"no config file to update: {config_file.default_config_path()} does not exist; fix: create one with "
            "`hasten config` or `hasten config default`"
        )
    config = config_file.load_config_file(path, fill_defaults=False)
    target = path
    if os.path.abspath(path) == os.path.abspath(config_file.accelerate_config_path()) and not args.config_file:
        target = config_file.default_config_path()  # never rewrite Accelerate's own file behind its back
    config_file.write_config_file(config, target)
    print(f"hasten config: updated {target}" + (f" (from {path})" if target != path else ""))
    return 0


def _explain(argv) -> int:
    from ..config.launch_settings import resolve_launch
    from ..config.resolve import format_explanation
    from .launch import add_launch_arguments

    parser = _Parser(prog="hasten config explain", allow_abbrev=False,
                     description="Show every value `hasten launch` would use with these flags, and where it comes from.")
    add_launch_arguments(parser)
    parser.add_argument("--all", action="store_true", help="Also list settings left at their built-in default.")
    args = parser.parse_args(argv)
    settings = resolve_launch(args)
    print(f"config file: {settings.config_path or 'none found'}")
    note = ("Values set in code (Accelerator(...) arguments) beat all of these; they are only known inside the "
            "script: call hasten.config.resolve.explain(code={...}) there.")
    print(format_explanation(settings.values, only_set=not args.all, note=note))
    exported = {k: v for k, v in settings.env.items() if k != "HASTEN_CONFIG_SOURCES"}
    if exported:
        print("\nexported to the training processes: " + " ".join(f"{k}={v}" for k, v in sorted(exported.items())))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action = argv[0] if argv and not argv[0].startswith("-") else None
    try:
        if action == "explain":
            return _explain(argv[1:])
        parser = _Parser(prog=f"hasten config{' ' + action if action else ''}", allow_abbrev=False,
                         description=__doc__.splitlines()[0])
        parser.add_argument("--config_file", "--config-file", default=None,
                            help=f"Where to write (default {config_file.default_config_path()}).")
        if action == "default":
            parser.add_argument("--mixed_precision", "--mixed-precision", default="no", type=str.lower,
                                choices=config_file.PRECISIONS)
        elif action not in (None, "update"):
            print(f"hasten config: unknown action {action!r}; choose default, update or explain "
                  "(or nothing, for the questionnaire)", file=sys.stderr)
            return 2
        args = parser.parse_args(argv[1:] if action else argv)
        return {"default": _default, "update": _update, None: _interactive}[action](args)
    except ConfigError as error:
        print(f"hasten config: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nhasten config: cancelled", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
