"""`hasten merge-weights`: turn a sharded FSDP checkpoint folder into one `model.safetensors` file."""

from __future__ import annotations

import argparse
import sys

from ..core.errors import CheckpointError


description = (
    "Merge the shards of a model saved with fsdp state_dict_type=SHARDED_STATE_DICT (a folder such as "
    "checkpoint_3/pytorch_model_fsdp_0) into one file that loads without FSDP."
)


def merge_weights_parser(subparsers=None) -> argparse.ArgumentParser:
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", description=description)
    else:
        parser = argparse.ArgumentParser("hasten merge-weights", description=description)
    parser.add_argument("checkpoint_directory", help="The sharded model folder (holds a .metadata file).")
    parser.add_argument("output_path", help="Folder to write model.safetensors (or pytorch_model.bin) into.")
    parser.add_argument("--unsafe_serialization", action="store_true",
                        help="Write pytorch_model.bin with torch.save instead of model.safetensors.")
    parser.add_argument("--remove_checkpoint_dir", action="store_true",
                        help="Delete the sharded folder after a successful merge.")
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


merge_command_parser = merge_weights_parser  # Accelerate's name (accelerate.commands.merge)


def merge_command(args):
    """Run the merge for parsed arguments; raises CheckpointError on a bad checkpoint folder."""
    from ..backends.fsdp.checkpoint import merge_fsdp_weights

    return merge_fsdp_weights(args.checkpoint_directory, args.output_path,
                              safe_serialization=not args.unsafe_serialization,
                              remove_checkpoint_dir=args.remove_checkpoint_dir)


def main(argv=None) -> int:
    args = merge_weights_parser().parse_args(argv)
    try:
        target = merge_command(args)
    except CheckpointError as error:
        print(f"hasten merge-weights: {error}", file=sys.stderr)
        return 1
    print(f"Merged weights written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
