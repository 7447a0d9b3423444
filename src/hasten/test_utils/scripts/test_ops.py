"""Collectives on nested tensors agree on every rank: gather, gather_object, broadcast, broadcast_object_list,
pad_across_processes, reduce and copy_tensor_to_devices. Run it in every process of a launch."""

from __future__ import annotations


def _expect(condition: bool, what: str, rank: int, got) -> None:
    if not condition:
        raise AssertionError(f"test_ops: {what} is wrong on rank {rank}: got {got}")


def check_ops(state) -> None:
    import torch

    from hasten.distributed.operations import (
        broadcast,
        broadcast_object_list,
        copy_tensor_to_devices,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
    )

    rank, world, device = state.process_index, state.num_processes, state.device
    mine = torch.arange(3, device=device, dtype=torch.float32) + 3 * rank
    gathered = gather({"x": mine, "pair": (mine * 2,)})
    expected = torch.arange(3 * world, dtype=torch.float32)
    _expect(torch.equal(gathered["x"].cpu(), expected) and torch.equal(gathered["pair"][0].cpu(), expected * 2),
            "gather of a nested structure", rank, gathered)
    objects = gather_object([{"rank": rank}])
    _expect(objects == [{"rank": r} for r in range(world)], "gather_object", rank, objects)
    sent = broadcast(torch.full((2,), float(rank), device=device), from_process=world - 1)
    _expect(sent.tolist() == [float(world - 1)] * 2, "broadcast from the last rank", rank, sent.tolist())
    payload = [f"from {rank}", rank]
    broadcast_object_list(payload, from_process=0)
    _expect(payload == ["from 0", 0], "broadcast_object_list", rank, payload)
    ragged = torch.ones(rank + 1, 2, device=device)  # rank r holds r + 1 rows
    for pad_first in (False, True):
        padded = pad_across_processes(ragged, pad_index=-1, pad_first=pad_first)
        real = padded[-(rank + 1):] if pad_first else padded[: rank + 1]
        filler = int((padded == -1).sum())
        _expect(padded.shape == (world, 2) and bool((real == 1).all()) and filler == 2 * (world - 1 - rank),
                f"pad_across_processes(pad_first={pad_first})", rank, padded.tolist())
    value = torch.tensor([float(rank + 1)], device=device)
    total = world * (world + 1) / 2
    _expect(reduce(value, "sum").item() == total, "reduce sum", rank, reduce(value, "sum").item())
    _expect(abs(reduce(value, "mean").item() - total / world) < 1e-6, "reduce mean", rank, reduce(value, "mean").item())
    copied = copy_tensor_to_devices(torch.tensor([7.0], device=device) if rank == 0 else None)
    _expect(copied.tolist() == [7.0], "copy_tensor_to_devices", rank, copied.tolist())


def main() -> None:
    from hasten.state import PartialState

    state = PartialState()
    check_ops(state)
    state.wait_for_everyone()
    state.print(f"test_ops: collectives agree on {state.num_processes} process(es)")


if __name__ == "__main__":
    main()
