"""A training script's start, up to its first checkpoint, to an object-store URL that cannot work.

    remote_first_save.py s3://bucket/prefix

Every rank prints `FIRST_SAVE <prepare|save> <ErrorClass>: <message>` for the error it met (with a URL as
project_dir, prepare() checks the store), then exits 1.
"""

import sys

import torch

from hasten import Accelerator, ProjectConfiguration


def main(root: str) -> None:
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True))
    stage = "prepare"
    try:
        model = accelerator.prepare(torch.nn.Linear(4, 4))
        stage = "save"
        accelerator.backward(model(torch.randn(2, 4)).sum())
        accelerator.save_state()
    except Exception as error:  # noqa: BLE001 - said, then the run ends as a failed one
        sys.stdout.write(f"FIRST_SAVE {stage} {type(error).__name__}: {error}\n")  # one write: no interleaving
        sys.stdout.flush()
        accelerator.end_training()
        sys.exit(1)
    raise AssertionError(f"the first save to {root} worked; it should not have")


if __name__ == "__main__":
    main(sys.argv[1])
