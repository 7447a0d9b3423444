"""A notebook cell's training function started by `notebook_launcher` on the XLA device (as in a Colab TPU
notebook). Usage: python notebook.py <replicas>; prints `CELL <index> <num_processes> <arg>` per replica."""

import sys

import torch

from hasten import notebook_launcher


def training_function(word):
    from hasten import Accelerator

    accelerator = Accelerator()
    total = accelerator.reduce(torch.ones(1, device=accelerator.device), "sum")
    assert int(total.item()) == accelerator.num_processes
    print(f"CELL {accelerator.process_index} {accelerator.num_processes} {word}", flush=True)


if __name__ == "__main__":
    notebook_launcher(training_function, args=("hi",), num_processes=int(sys.argv[1]))
