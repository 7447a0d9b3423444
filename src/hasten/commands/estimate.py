"""`hasten estimate-memory`: how much memory a model needs, without allocating any.

    hasten estimate-memory ./my-model-folder            # a local Hugging Face model folder (config.json)
    hasten estimate-memory mypackage.models:build_model # a Python factory `module:function` (or file.py:function)
    hasten estimate-memory resnet50 --library_name timm  # a timm architecture by name (built, not downloaded)

The model is built on the meta device (shapes only, no storage), so even a huge model costs nothing.
Reported per dtype: the parameter count, the largest layer (what must fit at once when layers are loaded one
by one), the weights for inference, and the peak for training with Adam at batch size 1 (weights, gradients
and two Adam states; activations are not included because they depend on batch size and sequence length).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Optional

from ..core.errors import ConfigError, HubAccessError

BYTES_PER_ELEMENT = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
# Training with Adam, in multiples of the weights in that dtype: weights + gradients + 2 Adam states.
TRAINING_FACTOR = {"float32": 4.0, "float16": 4.0, "bfloat16": 4.0}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _dtype(text: str) -> str:
    name = ALIASES.get(text.lower(), text.lower())
    if name not in BYTES_PER_ELEMENT:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(BYTES_PER_ELEMENT)} (or fp32/fp16/bf16)")
    return name


# ----------------------------------------------------------------------------------------------- building


def build_on_meta(spec: str, trust_remote_code: bool = False):
    """The model described by `spec` (a model folder, or `module:function`), with no storage allocated."""
    import torch

    if os.path.isdir(spec):
        return _from_hf_folder(spec, trust_remote_code), os.path.basename(os.path.abspath(spec))
    if ":" in spec:
        factory = _load_factory(spec)
        with torch.device("meta"):
            model = factory()
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module; return the model itself")
        return model, spec
    raise HubAccessError(
        f"{spec!r} is neither a local model folder nor `module:function`; hasten does not download from the Hub: "
        f"fetch the folder first (e.g. `huggingface-cli download {spec} config.json --local-dir ./model`) and pass "
        "./model"
    )


def _from_hf_folder(folder: str, trust_remote_code: bool):
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ConfigError(f"{folder} has no config.json; pass a Hugging Face model folder or `module:function`")
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            f"reading the model folder {folder} needs the transformers library; fix: pip install \"hasten[estimate]\" "
            "(or pip install transformers)"
        ) from None
    import torch

    try:
        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except ValueError as error:
        raise ConfigError(f"transformers cannot read {folder}/config.json: {str(error).splitlines()[0]}") from None
    with torch.device("meta"):
        try:
            return transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code)
        except ValueError as error:
            raise ConfigError(f"transformers cannot build a model from {folder}: {str(error).splitlines()[0]} "
                              "(add --trust_remote_code for custom code)") from None


def _load_factory(spec: str):
    target, _, name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            if not os.path.isfile(target):
                raise ConfigError(f"{target} does not exist (from {spec!r})")
            module_spec = importlib.util.spec_from_file_location("_hasten_estimate_target", target)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(target)
    except ImportError as error:
        raise ConfigError(f"cannot import {target!r} (from {spec!r}): {error}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigError(f"{target} has no function {name!r} (from {spec!r}); give `module:function`")
    return factory


# ----------------------------------------------------------------------------------------------- measuring


def measure(model) -> dict:
    """Element counts: total (parameters + buffers), parameters, and the largest layer with its name."""
    import torch

    def elements(module, recurse=True):
        tensors = list(module.parameters(recurse=recurse)) + list(module.buffers(recurse=recurse))
        return sum(t.numel() for t in tensors)

    parameters = sum(p.numel() for p in model.parameters())
    total = elements(model)
    # A "layer" is one block of a repeated stack (ModuleList/Sequential entries), or a module with weights
    # outside any stack (an embedding, a head): the largest piece that must fit at once.
    blocks = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            blocks += [(f"{name}.{child_name}".lstrip("."), child) for child_name, child in module.named_children()]
    inside = tuple(f"{name}." for name, _ in blocks)
    singles = [(name, m) for name, m in model.named_modules()
               if name and not list(m.children()) and elements(m) and not name.startswith(inside)
               and name not in {b for b, _ in blocks}]
    candidates = blocks + singles or [("(whole model)", model)]
    largest_name, largest = max(candidates, key=lambda item: elements(item[1]))
    return {"total": total, "parameters": parameters, "largest": elements(largest), "largest_name": largest_name}


def estimate(counts: dict, dtypes) -> list[dict]:
    rows = []
    for dtype in dtypes:
        size = BYTES_PER_ELEMENT[dtype]
        training = TRAINING_FACTOR.get(dtype)
        rows.append({
            "dtype": dtype,
            "largest_layer": counts["largest"] * size,
            "inference": counts["total"] * size,
            "training": None if training is None else counts["total"] * size * training,
        })
    return rows


def format_bytes(size: float | None) -> str:
    if size is None:
        return "N/A"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:.2f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.2f} TB"


def format_table(title: str, counts: dict, rows: list[dict]) -> str:
    header = ("dtype", "Largest layer", "Inference (weights)", "Training with Adam")
    cells = [(r["dtype"], format_bytes(r["largest_layer"]), format_bytes(r["inference"]), format_bytes(r["training"]))
             for r in rows]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(4)]

    def line(row):
        return "| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |"

    rule = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    lines = [
        f"Memory estimate for {title}",
        f"parameters: {counts['parameters']:,}  (with buffers: {counts['total']:,} values); "
        f"largest layer: {counts['largest_name']} ({counts['largest']:,} values)",
        rule, line(header), rule, *map(line, cells), rule,
        "Training = weights + gradients + 2 Adam states in that dtype, batch size 1, activations not included; "
        "with --mixed_precision (autocast) the weights stay in float32, so read the float32 row.",
    ]
    return "\n".join(lines)


def estimate_command_parser(subparsers=None):
    """The `estimate-memory` options: Accelerate's (`model_name`, `--library_name`, `--dtypes`,
    `--trust_remote_code`) plus hasten's dtypes (bfloat16, the fp32/fp16/bf16 spellings) and model sources."""
    description = "Estimate a model's memory for inference and training, without allocating it."
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", description=description)
    else:
        parser = _Parser(prog="hasten estimate-memory", allow_abbrev=False, description=description)
    parser.add_argument("model_name", metavar="model",
                        help="A local Hugging Face model folder (with config.json), module:function, or with "
                             "--library_name timm a timm architecture name.")
    parser.add_argument("--dtypes", nargs="+", type=_dtype, default=list(BYTES_PER_ELEMENT),
                        help="Any of float32 float16 bfloat16 int8 int4 (default: all).")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true",
                        help="Allow a model folder's own Python code to run (only for folders you trust).")
    parser.add_argument("--library_name", "--library-name", choices=("timm", "transformers"), default=None,
                        help="transformers (model folders, the default) or timm (architecture names).")
    if subparsers is not None:
        parser.set_defaults(func=estimate_command)
    return parser


def estimate_command(args) -> None:
    """Print the estimate for parsed `estimate_command_parser` arguments (raises what `create_empty_model` does)."""
    if args.library_name == "timm":
        model, title = create_empty_model(args.model_name, "timm"), args.model_name
    else:
        model, title = build_on_meta(args.model_name, args.trust_remote_code)
    counts = measure(model)
    print(format_table(title, counts, estimate(counts, args.dtypes)))


def main(argv=None) -> int:
    args = estimate_command_parser().parse_args(argv)
    try:
        estimate_command(args)
    except ConfigError as error:
        print(f"hasten estimate-memory: error: {error}", file=sys.stderr)
        return 2
    return 0


# ------------------------------------------------------------------------------ Accelerate's helper functions
# `accelerate.commands.estimate`'s functions, under its names, signatures and return shapes. Where Accelerate
# asks the Hub, hasten refuses in one line (HubAccessError, an OSError as Accelerate's offline error is).

_HUB_REFUSAL = ("hasten does not contact the Hugging Face Hub; download the model folder first "
                "(`huggingface-cli download {repo} config.json --local-dir ./model`) and pass ./model")


def verify_on_hub(repo: str, token: Optional[str] = None):
    """Accelerate looks `repo` up on the Hub here; hasten never does, so this always refuses."""
    raise HubAccessError(f"verify_on_hub({repo!r}): " + _HUB_REFUSAL.format(repo=repo))


def check_has_model(error) -> str:
    """Which library (`"timm"`, `"transformers"` or `"unknown"`) raised `error` because a model was not found."""
    message = str(error)
    if importlib.util.find_spec("timm") is not None:
        try:
            from huggingface_hub.utils import EntryNotFoundError
        except ImportError:
            EntryNotFoundError = ()  # noqa: N806 - without huggingface_hub nothing raises it
        if ((isinstance(error, RuntimeError) and "Unknown model" in message) or isinstance(error, EntryNotFoundError)
                or (isinstance(error, KeyError) and "architecture" in message)):
            return "timm"
    if (importlib.util.find_spec("transformers") is not None and isinstance(error, (OSError, ValueError))
            and ("does not appear to have a file named" in message or "Unrecognized model in" in message)):
        return "transformers"
    return "unknown"


def add_timm_hub_prefix(model_name: str) -> str:
    """`owner/name` becomes `hf-hub:owner/name` (timm's source prefix for Hub repos); architecture names and names
    that already carry a source prefix (`hf-hub:`, `local-dir:`) stay as they are."""
    if ":" in model_name or "/" not in model_name:
        return model_name
    return "hf-hub:" + model_name


def create_empty_model(model_name: str, library_name: Optional[str], trust_remote_code: bool = False,
                       access_token: Optional[str] = None):
    """`model_name` built on the meta device in float32: a local transformers model folder or `module:function`
    (library_name None or "transformers"), or a timm architecture or `local-dir:` name (library_name "timm")."""
    if access_token is not None:
        raise HubAccessError("create_empty_model(access_token=...): a token is for the Hub, which hasten never "
                             "contacts; read a local folder without one")
    if library_name not in (None, "transformers", "timm"):
        raise ValueError(f"Library `{library_name}` is not supported yet; use `transformers` or `timm`")
    if library_name == "timm":
        if add_timm_hub_prefix(model_name).startswith("hf-hub:"):
            raise HubAccessError(f"{model_name!r} is a timm model on the Hub: " + _HUB_REFUSAL.format(repo=model_name)
                                 + " with `local-dir:./model`")
        try:
            import timm
        except ImportError:
            raise ImportError(f"To check `{model_name}`, `timm` must be installed: pip install timm") from None
        import torch

        with torch.device("meta"):
            return timm.create_model(model_name, pretrained=False)
    return build_on_meta(model_name, trust_remote_code)[0]


def estimate_training_usage(bytes: int, mixed_precision: str, msamp_config: Optional[str] = None) -> dict:
    """Bytes for training with Adam at batch size 1, by part (`model`, `optimizer`, `gradients`, `step`), from the
    float32 size `bytes`; -1 where no estimate exists (int8/int4, and fp8 with an MS-AMP config)."""
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    if mixed_precision == "float32":
        sizes.update(model=bytes, gradients=bytes, optimizer=2 * bytes, step=4 * bytes)
    elif mixed_precision in ("float16", "bfloat16") or (mixed_precision == "fp8" and msamp_config is None):
        # mixed precision keeps float32 weights and Adam states; gradients come in float32 plus a half copy
        sizes.update(model=bytes, gradients=bytes + bytes // 2, optimizer=2 * bytes, step=2 * bytes)
    return sizes


_DIVISOR = {"float32": 1, "float16": 2, "bfloat16": 2, "int8": 4, "int4": 8}


def gather_data(args) -> list:
    """One row per dtype in `args.dtypes`: `[dtype, largest layer bytes, total bytes, estimate_training_usage(...)]`
    for the model `args.model_name` (see create_empty_model)."""
    from ..big_model.device_map import calculate_maximum_sizes

    model = create_empty_model(args.model_name, library_name=args.library_name,
                               trust_remote_code=args.trust_remote_code)
    total, (largest, _) = calculate_maximum_sizes(model)
    return [[dtype, largest / _DIVISOR[dtype], total / _DIVISOR[dtype], estimate_training_usage(total, dtype)]
            for dtype in args.dtypes]


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """`rows` (strings) under `headers` and `title`, boxed with line-drawing characters, cells centred."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def rule(left, middle, right):
        return left + middle.join("─" * width for width in widths) + right

    def line(cells):
        return "│" + "│".join(str(cell).center(width) for cell, width in zip(cells, widths)) + "│"

    return "\n".join(["┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", rule("├", "┬", "┤"), line(headers),
                      rule("├", "┼", "┤"), *map(line, rows), rule("└", "┴", "┘")])


if __name__ == "__main__":
    sys.exit(main())
