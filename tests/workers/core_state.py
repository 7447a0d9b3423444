"""Process control on N processes: identity, barriers, ordering, splitting, decorators, seeds, logging.

Run through `hasten launch` (see tests/test_state.py); N = 1 checks the single-process behaviour.
argv[1] is a scratch directory shared by the processes. Prints `CHECKS-PASSED <rank> <count>`.
"""

import logging
import os
import random
import sys
import time
from pathlib import Path

import torch

from hasten import AcceleratorState, DistributedType, GradientState, PartialState, get_logger, set_seed
from hasten import synchronize_rng_states
from hasten.utils import gather_object

scratch = Path(sys.argv[1])
state = PartialState()
rank, world = state.process_index, state.num_processes
checks = 0


def check(condition, what):
    global checks
    assert condition, f"rank {rank}: {what}"
    checks += 1


# -- identity ----------------------------------------------------------------------------------------------
check(world == int(os.environ.get("WORLD_SIZE", "1")), "num_processes matches the launcher")
check(PartialState() is not state and PartialState().process_index == rank, "Borg: a new instance shares state")
check(state.local_process_index == rank, "one machine: local index == global index")
check(state.is_main_process == (rank == 0) and state.is_local_main_process == (rank == 0), "main flags")
check(state.is_last_process == (rank == world - 1), "is_last_process")
check(state.device == torch.device("cpu"), f"device {state.device}")
if world > 1:
    # On a CPU-only machine N launched processes are a MULTI_CPU run, without any --cpu flag.
    check(state.distributed_type == DistributedType.MULTI_CPU, f"type {state.distributed_type}")
    check(state.backend == "gloo" and state.use_distributed, "gloo backend, distributed")
    check(torch.distributed.get_world_size() == world, "process group spans every process")
else:
    check(state.distributed_type == DistributedType.NO and not state.use_distributed, "one process: NO")
check(f"Num processes: {world}" in repr(state) and f"Process index: {rank}" in repr(state), "repr")

# -- wait_for_everyone / main_process_first: the main process's work is visible to the others -------------
marker = scratch / "main-first"
with state.main_process_first():
    if state.is_main_process:
        time.sleep(0.3)  # make a wrong order likely to show
        marker.write_text("written by main")
    else:
        check(marker.read_text() == "written by main", "main_process_first: main ran first")
state.wait_for_everyone()
local_marker = scratch / "local-main-first"
with state.local_main_process_first():
    if state.is_local_main_process:
        local_marker.write_text("local")
    else:
        check(local_marker.exists(), "local_main_process_first: local main ran first")

(scratch / f"arrived-{rank}").write_text("x")
state.wait_for_everyone()
check(all((scratch / f"arrived-{r}").exists() for r in range(world)), "wait_for_everyone is a barrier")

# -- split_between_processes -------------------------------------------------------------------------------
with state.split_between_processes(["A", "B", "C"]) as share:
    expected = {1: ["A", "B", "C"], 2: [["A", "B"], ["C"]][rank] if world == 2 else None}[world]
    check(share == expected, f"split list -> {share}")
with state.split_between_processes(["A", "B", "C"], apply_padding=True) as share:
    expected = {1: ["A", "B", "C"], 2: [["A", "B"], ["C", "C"]][rank] if world == 2 else None}[world]
    check(share == expected, f"split list with padding -> {share}")
with state.split_between_processes(("a", "b", "c", "d")) as share:
    check(isinstance(share, tuple) and len(share) == 4 // world, f"split tuple -> {share}")
with state.split_between_processes(torch.arange(5)) as share:
    expected = {1: [0, 1, 2, 3, 4], 2: [[0, 1, 2], [3, 4]][rank] if world == 2 else None}[world]
    check(share.tolist() == expected, f"split tensor -> {share.tolist()}")
with state.split_between_processes(torch.arange(5), apply_padding=True) as share:
    expected = {1: [0, 1, 2, 3, 4], 2: [[0, 1, 2], [3, 4, 4]][rank] if world == 2 else None}[world]
    check(share.tolist() == expected, f"split tensor with padding -> {share.tolist()}")
with state.split_between_processes({"x": [1, 2, 3], "y": torch.tensor([10, 20, 30])}) as share:
    if world == 2:
        check(share["x"] == [[1, 2], [3]][rank] and share["y"].tolist() == [[10, 20], [30]][rank], f"dict {share}")
    else:
        check(share["x"] == [1, 2, 3], "one process: dict unchanged")
if world > 1:
    try:
        with state.split_between_processes({"x": [1, 2], "y": [1]}):
            pass
        check(False, "dict values of different lengths must fail")
    except ValueError:
        check(True, "")
with state.split_between_processes(list(range(7))) as share:
    everything = gather_object(share)
check(everything == list(range(7)), "shares cover the input exactly once")

# -- decorators --------------------------------------------------------------------------------------------
def named(name):
    def function():
        return name
    return function


check((state.on_main_process(named("main"))() == "main") == (rank == 0 or world == 1), "on_main_process")
check((state.on_local_main_process(named("lm"))() == "lm") == (rank == 0 or world == 1), "on_local_main_process")
check((state.on_last_process(named("last"))() == "last") == (rank == world - 1), "on_last_process")
check((state.on_process(named("p"), process_index=world - 1)() == "p") == (rank == world - 1), "on_process")


@state.on_process(process_index=0)
def only_first():
    return "first"


check((only_first() == "first") == (rank == 0 or world == 1), "on_process as a decorator factory")
check((state.on_local_process(named("l1"), local_process_index=world - 1)() == "l1") == (rank == world - 1),
      "on_local_process")

# -- print -------------------------------------------------------------------------------------------------
state.print(f"PRINTED-BY {rank}")

# -- seeds and RNG synchronisation -------------------------------------------------------------------------
set_seed(1234)
same = torch.rand(3)
check(gather_object([same.tolist()]) == [same.tolist()] * world if world > 1 else True, "set_seed: same everywhere")
set_seed(1234, device_specific=True)
specific = torch.rand(3)
if world > 1:
    drawn = gather_object([specific.tolist()])
    check(len({tuple(d) for d in drawn}) == world, "set_seed(device_specific=True) differs per rank")
set_seed(99)
check(random.random() == random.Random(99).random(), "set_seed seeds Python's random")
torch.manual_seed(rank)  # different streams...
generator = torch.Generator().manual_seed(100 + rank)
synchronize_rng_states(["torch", "generator"], generator=generator)
after = gather_object([(torch.rand(2).tolist(), torch.rand(2, generator=generator).tolist())])
check(all(a == after[0] for a in after) if world > 1 else True, "synchronize_rng_states copies rank 0's states")

# -- logging -----------------------------------------------------------------------------------------------
logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stdout, force=True)
logger = get_logger("core_state", log_level="INFO")
logger.info("LOG-MAIN-ONLY")
logger.info("LOG-EVERYWHERE", main_process_only=False)
for _ in range(3):
    logger.info("LOG-IN-ORDER", in_order=True)
sys.stdout.flush()

# -- AcceleratorState / GradientState share the process state --------------------------------------------
accelerator_state = AcceleratorState(_from_accelerator=True)
check(accelerator_state.num_processes == world and accelerator_state.process_index == rank, "AcceleratorState")
check(AcceleratorState().mixed_precision == "no", "AcceleratorState() reads back the live state")
check(GradientState().sync_gradients is True, "GradientState defaults")

# -- destroy_process_group ---------------------------------------------------------------------------------
state.wait_for_everyone()
print(f"CHECKS-PASSED {rank} {checks}", flush=True)
state.destroy_process_group()
if world > 1:
    assert not torch.distributed.is_initialized(), "destroy_process_group tears the group down"
