"""`hasten to-fsdp2`: rewrite the `fsdp_config` block of a config file written for FSDP1 so it runs on FSDP2.

    hasten to-fsdp2 --config_file old.yaml --output_file new.yaml
    hasten to-fsdp2 --config_file cfg.yaml --overwrite

FSDP2 (`fully_shard`) has no sharding strategy: whether parameters are re-sharded after the forward is its
one knob, so FULL_SHARD/HYBRID_SHARD become `fsdp_reshard_after_forward: true` and SHARD_GRAD_OP,
HYBRID_SHARD_ZERO2 and NO_SHARD become `false`. Keys FSDP2 does not have are dropped, each with a warning.
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import os
import sys
from pathlib import Path

from ..core.errors import ConfigError

# FSDP1 keys FSDP2 has no counterpart for -> why they are dropped
DROPPED_KEYS = {
    "fsdp_backward_prefetch": "FSDP2 always prefetches the next all-gather in backward",
    "fsdp_forward_prefetch": "FSDP2 has no forward prefetch setting",
    "fsdp_sync_module_states": "FSDP2 loads through fsdp_cpu_ram_efficient_loading instead",
    "fsdp_use_orig_params": "FSDP2 always keeps the original parameters",
}
RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True, "HYBRID_SHARD": True,
    "SHARD_GRAD_OP": False, "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False,
}


class ConversionStatus(enum.Enum):
    """What became of an FSDP1 key that has no FSDP2 key (Accelerate's names and values)."""

    NOT_YET_IMPLEMENTED = 0  # FSDP2 could have it, but has no setting for it
    REMOVED = -1  # FSDP2 does it always, or otherwise


# FSDP1 key -> its FSDP2 key, or what became of it (the table `convert_config_to_fsdp2` follows; a key not
# listed is carried over as it is)
ARGUMENT_KEY_MAPPING = {
    **{key: ConversionStatus.REMOVED for key in DROPPED_KEYS},
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
}
# FSDP1 key -> {FSDP1 value: FSDP2 value} for the keys whose values change
ARGUMENT_VALUE_MAPPING = {
    "fsdp_sharding_strategy": RESHARD_AFTER_FORWARD,
    "fsdp_reshard_after_forward": RESHARD_AFTER_FORWARD,  # a config `hasten config` wrote for FSDP1
}
# FSDP1 strategies may also be written by number (1 = FULL_SHARD, ... as in `hasten config`)
_STRATEGY_NUMBERS = {1: "FULL_SHARD", 2: "SHARD_GRAD_OP", 3: "NO_SHARD", 4: "HYBRID_SHARD", 5: "HYBRID_SHARD_ZERO2"}


logger = logging.getLogger(__name__)


def _warn(message: str) -> None:
    # logged, as Accelerate's command logs (code captures the records); with no logging set up Python prints
    # warnings to stderr
    logger.warning(f"hasten to-fsdp2: {message}")


def _reshard_value(key: str, value):
    if isinstance(value, bool):
        return value
    name = _STRATEGY_NUMBERS.get(value, value) if isinstance(value, int) else str(value).strip()
    name = name.upper().split(".")[-1]  # "ShardingStrategy.FULL_SHARD" -> "FULL_SHARD"
    if name in ("TRUE", "FALSE"):
        return name == "TRUE"
    if name not in ARGUMENT_VALUE_MAPPING[key]:
        raise ConfigError(
            f"fsdp_config.{key} has value {value!r}; expected one of {', '.join(RESHARD_AFTER_FORWARD)} or true/false"
        )
    return ARGUMENT_VALUE_MAPPING[key][name]


def convert_config_to_fsdp2(config: dict) -> dict:
    """Return `config` with its `fsdp_config` block rewritten for FSDP2 (a config without one, or already
    on version 2, comes back unchanged)."""
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        _warn("the config has no fsdp_config block; nothing to convert")
        return config
    if int(fsdp.get("fsdp_version", 1)) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion... (fsdp_config has fsdp_version: 2; "
                       "the file is left unchanged)")
        return config
    converted = {}
    for key, value in fsdp.items():
        target = ARGUMENT_KEY_MAPPING.get(key, key)
        if isinstance(target, ConversionStatus):
            _warn(f"dropped {key} ({DROPPED_KEYS[key]})")
        elif key in ARGUMENT_VALUE_MAPPING:
            converted[target] = _reshard_value(key, value)
        else:
            converted[key] = value
    converted["fsdp_version"] = 2
    return {**config, "fsdp_config": converted}


def load_config(config_file: str) -> dict:
    import yaml

    with open(config_file, encoding="utf-8") as handle:
        try:
            config = yaml.safe_load(handle)  # JSON is YAML too
        except yaml.YAMLError as error:
            raise ConfigError(f"{config_file} is not valid YAML or JSON: {error}".splitlines()[0]) from None
    if not config:
        raise ConfigError(f"{config_file} is empty")
    if not isinstance(config, dict):
        raise ConfigError(f"{config_file} must hold `key: value` lines, not a {type(config).__name__}")
    return config


def to_fsdp2_command_parser(subparsers=None) -> argparse.ArgumentParser:
    description = "Rewrite a config file's FSDP1 settings for FSDP2 (fully_shard)."
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", description=description)
    else:
        parser = argparse.ArgumentParser("hasten to-fsdp2", description=description, allow_abbrev=False)
    parser.add_argument("--config_file", "--config-file", required=True, help="The config file to convert.")
    parser.add_argument("--overwrite", action="store_true",
                        help="Write the result over --output_file even if it exists (or over --config_file "
                             "when no --output_file is given).")
    parser.add_argument("--output_file", "--output-file", default=None,
                        help="Where to write the converted config (required without --overwrite).")
    if subparsers is not None:
        parser.set_defaults(func=to_fsdp2_command)
    return parser


def to_fsdp2_command(args) -> str:
    """Convert `args.config_file`; returns the path written. Raises on a missing input or a refused output."""
    if not os.path.isfile(args.config_file):
        raise FileNotFoundError(f"config file {args.config_file} not found")
    output = args.output_file
    if output is None:
        if not args.overwrite:
            raise ConfigError("give --output_file PATH, or --overwrite to rewrite the config file in place")
        output = args.config_file
    elif Path(output).exists() and not args.overwrite:
        raise FileExistsError(f"Output file `{output}` already exists and --overwrite is not set; pass --overwrite "
                              "to replace it, or choose another --output_file")
    converted = convert_config_to_fsdp2(load_config(args.config_file))
    text = (json.dumps(converted, indent=2) + "\n") if output.endswith(".json") else _yaml_text(converted)
    tmp = f"{output}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, output)  # the old file stays whole if writing fails
    return output


def _yaml_text(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)


def main(argv=None) -> int:
    args = to_fsdp2_command_parser().parse_args(argv)
    try:
        output = to_fsdp2_command(args)
    except (OSError, ValueError) as error:
        print(f"hasten to-fsdp2: {error}", file=sys.stderr)
        return 1
    print(f"FSDP2 config written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
