"""A training script's start, up to its first checkpoint, to an object-store URL that cannot work.

    remote_first_save.py s3://bucket/prefix

Every rank prints `FIRST_SAVE <ErrorClass>: <message>` for the error its first save_state raised, then exits 1.
"""

import sys

import torch

from hasten import Accelerator, ProjectConfiguration


def main(root: str) -> None:
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True))
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    accelerator.backward(model(torch.randn(2, 4)).sum())
    try:
        accelerator.save_state()
    except Exception as error:  # noqa: BLE001 - said, then the run ends as a failed one
        print(f"FIRST_SAVE {type(error).__name__}: {error}", flush=True)
        accelerator.end_training()
        sys.exit(1)
    raise AssertionError(f"the first save to {root} worked; it should not have")


if __name__ == "__main__":
    main(sys.argv[1])
