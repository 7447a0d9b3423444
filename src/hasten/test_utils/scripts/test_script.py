"""The end-to-end self-check: the processes start and agree (collectives, a few training steps leave the same
weights everywhere: `hasten test`'s check), a prepared data loader hands every sample to exactly one rank and
`gather_for_metrics` gives each back once, `main_process_first` orders the ranks, and `set_seed` seeds them alike.
Run it in every process of a launch."""

from __future__ import annotations


def _fail(what: str, rank: int, got) -> None:
    raise AssertionError(f"test_script: {what} on rank {rank}: {got}")


def check_data(accelerator, length: int = 21, batch_size: int = 4) -> None:
    import torch
    from torch.utils.data import DataLoader

    rank = accelerator.process_index
    loader = accelerator.prepare(DataLoader(torch.arange(length), batch_size=batch_size, shuffle=True))
    seen = torch.cat([accelerator.gather_for_metrics(batch) for batch in loader]).tolist()
    if sorted(seen) != list(range(length)):
        _fail("gather_for_metrics over a prepared loader did not give every sample exactly once", rank, sorted(seen))


def check_order_and_seed(accelerator) -> None:
    import os
    import tempfile

    import torch

    from hasten.distributed.operations import broadcast_object_list
    from hasten.distributed.rng import set_seed

    rank = accelerator.process_index
    folder = [tempfile.mkdtemp(prefix="hasten-test-script-") if accelerator.is_main_process else None]
    broadcast_object_list(folder)
    marker = os.path.join(folder[0], "main-was-here")
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            open(marker, "w").close()
        elif not os.path.exists(marker):
            _fail("main_process_first let this rank in before the main process", rank, marker)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.remove(marker)
        os.rmdir(folder[0])
    set_seed(1234)
    draws = torch.rand(3)
    everyone = accelerator.gather(draws.to(accelerator.device).unsqueeze(0)).cpu()
    if not torch.equal(everyone, draws.expand(accelerator.num_processes, 3)):
        _fail("set_seed left the ranks with different random numbers", rank, everyone.tolist())


def main() -> None:
    from hasten.accelerator import Accelerator
    from hasten.commands.test import self_check

    self_check()  # collectives and four training steps; raises SystemExit naming the problem
    accelerator = Accelerator()
    check_data(accelerator)
    check_order_and_seed(accelerator)
    accelerator.wait_for_everyone()
    accelerator.print(f"test_script: all checks passed on {accelerator.num_processes} process(es)")


if __name__ == "__main__":
    main()
