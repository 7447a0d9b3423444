"""A notebook cell's training function started by `notebook_launcher` on the XLA device (as in a Colab TPU
notebook). Usage: python notebook.py <replicas> [fail]; prints `CELL <index> <num_processes> <arg>` per replica.
With `fail`, replica 1 raises before the collective that replica 0 then waits in; with `crash`, it dies of a
segmentation fault there."""

import sys

import torch

from hasten import notebook_launcher


def training_function(word):
    from hasten import Accelerator

    accelerator = Accelerator()
    if word == "fail" and accelerator.process_index == 1:
        raise ValueError("replica 1 gave up")
    if word == "crash" and accelerator.process_index == 1:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    total = accelerator.reduce(torch.ones(1, device=accelerator.device), "sum")
    assert int(total.item()) == accelerator.num_processes
    # one write: the replicas print at the same moment, right after the collective, and print's separate write of
    # the newline let two lines run together ("CELL 0 2 hiCELL 1 2 hi", seen in a run)
    sys.stdout.write(f"CELL {accelerator.process_index} {accelerator.num_processes} {word}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    notebook_launcher(training_function, args=(sys.argv[2] if len(sys.argv) > 2 else "hi",),
                      num_processes=int(sys.argv[1]))
