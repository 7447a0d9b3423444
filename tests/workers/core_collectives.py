"""Every collective of hasten.distributed.operations on N processes (N = 1 checks the single-process fallbacks).

Run through `hasten launch` (see tests/distributed/test_operations.py). With `--debug`, also checks that mismatched
inputs raise DistributedOperationException naming the differing rank, and that the ranks stay in step after.
Prints one `CHECKS-PASSED <rank> <count>` line per process.
"""

from collections import namedtuple

import torch

from hasten import PartialState
from hasten.utils import (
    DistributedOperationException, broadcast, broadcast_object_list, copy_tensor_to_devices, gather,
    gather_object, pad_across_processes, reduce,
)

Pair = namedtuple("Pair", ["left", "right"])
state = PartialState()
rank, world = state.process_index, state.num_processes
checks = 0


def check(condition, what):
    global checks
    assert condition, f"rank {rank}: {what}"
    checks += 1


# -- gather ------------------------------------------------------------------------------------------------
mine = torch.full((2, 3), float(rank))
gathered = gather(mine)
check(gathered.shape == (2 * world, 3), f"gather shape {gathered.shape}")
check(all((gathered[2 * r:2 * r + 2] == r).all() for r in range(world)), "gather puts rank r's rows at block r")
if world == 1:
    check(gather(mine) is mine, "one process: gather returns its input")

scalar = gather(torch.tensor(rank))
expected = list(range(world)) if world > 1 else 0  # one process: returned as is, still 0-d
check(scalar.tolist() == expected, f"gather of 0-d tensors -> {scalar.tolist()}")

nested = {"ids": [torch.tensor([rank]), (torch.tensor([10 * rank]),)], "pair": Pair(torch.ones(1), torch.zeros(1, 2))}
out = gather(nested)
check(isinstance(out, dict) and isinstance(out["ids"], list) and isinstance(out["ids"][1], tuple), "nested types kept")
check(isinstance(out["pair"], Pair), "namedtuple kept")
check(out["ids"][0].tolist() == list(range(world)), "nested list leaf gathered")
check(out["ids"][1][0].tolist() == [10 * r for r in range(world)], "nested tuple leaf gathered")
check(out["pair"].right.shape == (world, 2), "namedtuple leaf gathered")
if world > 1:
    try:
        gather({"not a tensor": "text"})
        check(False, "gather of a string must fail")
    except TypeError:
        check(True, "")

# -- gather_object -----------------------------------------------------------------------------------------
objects = gather_object([{"rank": rank, "name": f"p{rank}"}])
if world > 1:
    check(objects == [{"rank": r, "name": f"p{r}"} for r in range(world)], f"gather_object -> {objects}")
    # Accelerate flattens one level (quirk Q6): a string is an iterable of characters.
    check(gather_object("ab") == ["a", "b"] * world, "gather_object flattens one level")
    uneven = gather_object(list(range(rank + 1)))
    check(uneven == [i for r in range(world) for i in range(r + 1)], f"gather_object of uneven lists -> {uneven}")
else:
    check(objects == [{"rank": 0, "name": "p0"}], "one process: gather_object returns the object")
    check(gather_object("ab") == "ab", "one process: gather_object does not flatten")

# -- reduce ------------------------------------------------------------------------------------------------
value = torch.tensor([1.0, 2.0]) * (rank + 1)
total = sum(range(1, world + 1))
check(reduce(value, "sum").tolist() == [total, 2.0 * total], "reduce sum")
check(torch.allclose(reduce(value), torch.tensor([total, 2.0 * total]) / world), "reduce default is mean")
check(reduce(value, "none").tolist() == [total, 2.0 * total], "reduce 'none' sums (Accelerate quirk Q5)")
check(reduce(value, "max").tolist() == [float(world), 2.0 * world], "reduce max")
check(value.tolist() == [rank + 1.0, 2.0 * (rank + 1)], "reduce does not change its input")
check(reduce(value, "sum") is not value, "reduce returns a new tensor")
ints = reduce({"n": [torch.tensor([rank], dtype=torch.int64)]}, "sum")
check(ints["n"][0].dtype == torch.int64 and ints["n"][0].item() == sum(range(world)), "reduce nested ints")

# -- broadcast ---------------------------------------------------------------------------------------------
data = {"w": torch.full((3,), float(rank)), "b": [torch.tensor([rank, rank])]}
result = broadcast(data)
check(result["w"] is data["w"] and result["b"][0] is data["b"][0], "broadcast works in place")
check((data["w"] == 0).all() and data["b"][0].tolist() == [0, 0], "broadcast from rank 0 overwrote in place")
last = broadcast(torch.tensor([float(rank)]), from_process=world - 1)
check(last.item() == world - 1, "broadcast from the last process")

objs = [f"from {rank}", {"rank": rank}, None]
returned = broadcast_object_list(objs, from_process=world - 1)
check(returned is objs and objs == [f"from {world - 1}", {"rank": world - 1}, None], f"broadcast_object_list -> {objs}")

# -- pad_across_processes (uneven shapes, padding first and last) ------------------------------------------
uneven = torch.arange(rank + 1, dtype=torch.float32).reshape(rank + 1, 1).repeat(1, 2)
padded = pad_across_processes(uneven)
check(padded.shape == (world, 2), f"padded shape {padded.shape}")
check((padded[: rank + 1] == uneven).all() and (padded[rank + 1:] == 0).all(), "pad last with zeros")
first = pad_across_processes(uneven, pad_index=-1, pad_first=True)
check((first[world - rank - 1:] == uneven).all() and (first[: world - rank - 1] == -1).all(), "pad first with -1")
check(gather(padded).shape == (world * world, 2), "padded tensors gather")
wide = pad_across_processes(torch.ones(2, rank + 2, dtype=torch.int64), dim=1, pad_index=7)
check(wide.shape == (2, world + 1) and wide.dtype == torch.int64, f"pad along dim 1 -> {wide.shape}")
check((wide[:, rank + 2:] == 7).all(), "pad along dim 1 uses pad_index")
structure = pad_across_processes({"a": [torch.zeros(rank + 1)], "b": torch.zeros(1)})
check(structure["a"][0].shape == (world,) and structure["b"].shape == (1,), "pad nested structure")
untouched = torch.zeros(rank + 1)
check(pad_across_processes(untouched, dim=3) is untouched, "pad on a missing dim leaves the tensor alone")

# -- copy_tensor_to_devices --------------------------------------------------------------------------------
shared = copy_tensor_to_devices(torch.arange(4) if rank == 0 else None)
check(shared.tolist() == [0, 1, 2, 3], "copy_tensor_to_devices shares rank 0's tensor")

# -- debug mode: mismatches raise instead of hanging -------------------------------------------------------
if state.debug and world > 1:
    def expect_mismatch(call, *needles):
        try:
            call()
        except DistributedOperationException as error:
            text = str(error)
            check("\n" not in text, "the error is one line")
            for needle in needles:
                check(needle in text, f"{needle!r} not in {text!r}")
            return
        check(False, f"no DistributedOperationException from {call}")

    expect_mismatch(lambda: gather(torch.zeros(rank + 1, 2)), "`gather`", "rank 1 differs", "rank 0: [1, 2]",
                    "rank 1: [2, 2]")
    expect_mismatch(lambda: reduce(torch.zeros(2, dtype=torch.float32 if rank == 0 else torch.float64)),
                    "`reduce`", "float64")
    expect_mismatch(lambda: broadcast([torch.zeros(1)] * (rank + 1)), "`broadcast`", "rank 1")
    expect_mismatch(lambda: pad_across_processes(torch.zeros((1,) * (rank + 1))), "`pad_across_processes`")
    # After the errors every rank is still in step: a normal collective works.
    check(gather(torch.tensor([rank])).tolist() == list(range(world)), "collectives work after a mismatch")

state.wait_for_everyone()
print(f"CHECKS-PASSED {rank} {checks}", flush=True)
