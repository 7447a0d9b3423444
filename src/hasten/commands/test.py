"""`hasten test`: launch a short self-check with the user's configuration and say plainly whether it works.

    hasten test [--config_file PATH] [any other `hasten launch` flag, e.g. --num_processes 2 --cpu]

The check runs through `hasten launch` exactly as training would: the processes start, collectives give the
same answer on every rank, and a few training steps of a small model through `Accelerator.prepare` leave
identical weights everywhere.
"""

from __future__ import annotations

import subprocess
import sys

SUCCESS = "Test is a success! You are ready for your distributed training!"


def _fail(message: str) -> None:
    raise SystemExit(f"hasten self-check failed: {message}")


def _check_collectives(accelerator) -> None:
    import torch

    from ..distributed.operations import broadcast, gather, gather_object, reduce

    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    gathered = gather(torch.tensor([rank], device=device))
    if gathered.tolist() != list(range(world)):
        _fail(f"gather of each rank's index gave {gathered.tolist()} on rank {rank}, expected {list(range(world))}")
    total = reduce(torch.tensor([float(rank + 1)], device=device), reduction="sum")
    if total.item() != world * (world + 1) / 2:
        _fail(f"sum over ranks gave {total.item()} on rank {rank}, expected {world * (world + 1) / 2}")
    sent = broadcast(torch.full((3,), float(rank), device=device), from_process=0)
    if sent.tolist() != [0.0, 0.0, 0.0]:
        _fail(f"broadcast from rank 0 arrived as {sent.tolist()} on rank {rank}")
    objects = gather_object([{"rank": rank}])
    if [o["rank"] for o in objects] != list(range(world)):
        _fail(f"gather_object gave {objects} on rank {rank}")


def _check_training(accelerator, steps: int = 4) -> float:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ..distributed.operations import gather
    from ..distributed.rng import set_seed

    set_seed(0)
    inputs = torch.randn(64, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    batches = iter(loader)
    for _ in range(steps):
        x, y = (t.to(accelerator.device) for t in next(batches))
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    weights = torch.cat([p.detach().float().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
    everyone = gather(weights.unsqueeze(0))
    if not torch.allclose(everyone, everyone[0].expand_as(everyone)):
        _fail(f"after {steps} training steps the weights differ between ranks (rank {accelerator.process_index})")
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        _fail(f"the loss is not finite on rank {accelerator.process_index}: {losses}")
    return losses[-1]


def self_check() -> int:
    """Runs in every launched process."""
    from ..accelerator import Accelerator

    accelerator = Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    accelerator.print(f"hasten self-check: {world} process(es), {accelerator.distributed_type}, device "
                      f"{accelerator.device.type}, mixed precision {accelerator.mixed_precision}")
    _check_collectives(accelerator)
    loss = _check_training(accelerator)
    accelerator.wait_for_everyone()
    print(f"hasten self-check: rank {rank}/{world} ok (collectives agree, 4 training steps, last loss {loss:.4f})",
          flush=True)
    return 0


def _run(launch_argv: list) -> int:
    command = [sys.executable, "-m", "hasten", "launch", *launch_argv, "-m", "hasten.commands.test",
               "--self-check-worker"]
    print("Running: " + " ".join(["hasten", "launch", *launch_argv, "-m", "hasten.commands.test"]), flush=True)
    code = subprocess.call(command)
    if code == 0:
        print(SUCCESS)
    else:
        print(f"hasten test: the self-check failed (exit code {code}); the reason is printed above", file=sys.stderr)
    return code


def test_command_parser(subparsers=None):
    """Accelerate's parser for `accelerate test`: `--config_file` only (`hasten test` also passes any other
    `hasten launch` flag through)."""
    import argparse

    description = "Launch a short self-check of distributed training with a config file."
    if subparsers is not None:
        parser = subparsers.add_parser("test", description=description)
    else:
        parser = argparse.ArgumentParser(prog="hasten test", description=description)
    parser.add_argument("--config_file", "--config-file", default=None,
                        help="The config file to launch with (default: the one `hasten launch` reads).")
    if subparsers is not None:
        parser.set_defaults(func=test_command)
    return parser


def test_command(args) -> None:
    """Run the self-check with `args.config_file`; a failed check raises RuntimeError (as Accelerate's does)."""
    config_file = getattr(args, "config_file", None)
    code = _run([f"--config_file={config_file}"] if config_file else [])
    if code != 0:
        raise RuntimeError(f"hasten test: the self-check failed with exit code {code}; the reason is printed above")


test_command.__test__ = False  # a command, not a test for pytest to collect
test_command_parser.__test__ = False


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--self-check-worker"]:
        return self_check()
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    return _run(argv)

if __name__ == "__main__":
    sys.exit(main())
