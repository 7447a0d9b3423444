"""Processes started from Python (`notebook_launcher`, `debug_launcher`: forked children of torch's elastic agent)
that leave before the group forms: each child says in the agent's store when its function has ended, and a child
joining the process group stops waiting for a peer that has left.

Why: such a function may end on one process without building any state while another builds `PartialState()`
(Accelerate's notebook test does, with a queue that only one process finds non-empty). Under Accelerate each CPU
child was a one-process state, so nobody waited; here the children form one group, and the joining one waited for
the absent peer until the collective timeout (30 minutes on gloo), silently. Now it fails at once, naming the peer.
"""

from __future__ import annotations

import os
import time

watched = False  # set by hasten.launchers in each forked child; nothing else writes departures
_arrivals = 0  # groups this process began to join (a group made again gets its own keys)


def attempt_store(store):
    """The key space of this torchelastic attempt: a restarted attempt must not read the keys of the one before."""
    import torch.distributed as dist

    return dist.PrefixStore(f"hasten/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def _left_key(rank: int) -> str:
    return f"hasten/left/{rank}"


def announce_departure() -> None:
    """In a forked child whose function has ended (returned or raised): tell peers still joining not to wait."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return  # no store outlives this process (rank 0 would host it); nothing waits on an absent agent store
    from datetime import timedelta

    import torch.distributed as dist

    from ..core.env import parse_int

    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], parse_int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=30))
        attempt_store(store).set(_left_key(parse_int(os.environ.get("RANK", "0"))), "1")
    except (RuntimeError, OSError, KeyError, ValueError):
        # best effort, and nothing is lost: the process is leaving anyway, and a peer that cannot be told still
        # ends at the collective timeout, as before
        return


def wait_for_arrivals(store, rank: int, world_size: int, timeout) -> None:
    """Return once every process has begun to join the group; raise at once if a peer has left instead, or when
    `timeout` passes. Polls with `check` (a store `wait` that times out logs a warning each time)."""
    from ..core.errors import ProcessLeftError

    global _arrivals
    if world_size <= 1:
        return
    _arrivals += 1
    everyone = f"hasten/all_arrived{_arrivals}"
    store.set(f"hasten/arrived{_arrivals}/{rank}", "1")
    if store.add(f"hasten/arrived{_arrivals}", 1) == world_size:
        store.set(everyone, "1")
    deadline = time.monotonic() + timeout.total_seconds()
    pause = 0.01
    while not store.check([everyone]):
        absent = [r for r in range(world_size) if not store.check([f"hasten/arrived{_arrivals}/{r}"])]
        left = [r for r in absent if store.check([_left_key(r)])]
        if left and not store.check([everyone]):
            raise ProcessLeftError(
                f"rank {rank}: rank{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} of {world_size} ended "
                "the launched function without joining the process group, so the group cannot form. Fix: build "
                "`PartialState()` / `Accelerator()` on every process of the launch, or on none"
            )
        if time.monotonic() > deadline:
            raise ProcessLeftError(
                f"rank {rank}: rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} of {world_size} "
                f"did not begin to join the process group within {timeout.total_seconds():.0f} s (the collective "
                "timeout); every process of the launch must build `PartialState()` / `Accelerator()`"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
