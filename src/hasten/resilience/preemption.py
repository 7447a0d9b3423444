"""Preemption: SIGTERM or SIGUSR1 -> a checkpoint at the next step boundary on every rank -> exit code 75.

SLURM sends SIGTERM before it kills a preempted or cancelled job (and SIGUSR1 ahead of the time limit when asked
with `--signal=USR1@<seconds>`); Kubernetes sends SIGTERM before it kills a pod; torchrun's agent passes the
signal it receives on to every worker. The handler installed here only notes the signal. At the end of every
`accumulate()` block that stepped the optimizer, the ranks agree whether any of them got one (an all_reduce of
one integer over a CPU group of its own, started in the background and read at the next boundary), so a signal
that reaches one rank only, or the ranks at different steps, still stops them all after the same step (the
second boundary after the signal). They then write a checkpoint with `save_state()` and leave with
`PREEMPTED_EXIT_CODE`, which tells a wrapper script (or `hasten launch`) that the run should be started again;
`ProjectConfiguration(automatic_resume=True)` picks it up there. No finished step is lost.

Opt-in through `ProjectConfiguration(handle_preemption=True)` (on with `automatic_resume=True`): a library
that silently takes over SIGTERM would surprise a script with its own handler. See docs/fault_tolerance.md.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import warnings

import torch

from ..core.errors import ConfigError
from .requeue import PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS  # one definition, shared with the launcher

logger = logging.getLogger(__name__)

_active = None  # the handler installed in this process (the newest Accelerator's)


def requested() -> bool:
    """Whether this process has received a preemption signal (e.g. to cut a long evaluation short)."""
    return _active is not None and _active.received is not None


class PreemptionHandler:
    """Notes SIGTERM/SIGUSR1; at each step boundary, agrees with the other ranks and checkpoints and exits."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.received = None  # the first signal's number, set by the handler
        self._previous = {}
        self._group = None
        self._flag = torch.zeros(1, dtype=torch.int64, device="cpu")  # the agreement runs on the CPU: no device sync per step
        self._pending = None  # the agreement started at the previous boundary (work handle)
        self._distributed = accelerator.state.use_distributed and torch.distributed.is_initialized()
        self._boundaries = self._optimizer_steps = 0

    def install(self) -> "PreemptionHandler":
        global _active
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError("ProjectConfiguration(handle_preemption=True) needs the Accelerator to be built in the "
                              "main thread (signal handlers can only be set there); set handle_preemption=False")
        if self._distributed:
            # A gloo group of its own (NCCL cannot reduce a CPU tensor; and the flag then never queues behind the
            # model's gradients), built once, by every rank, here.
            self._group = torch.distributed.new_group(backend="gloo")
        for sig in PREEMPTION_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        _active = self
        return self

    def uninstall(self) -> None:
        global _active
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        if _active is self:
            _active = None

    def _on_signal(self, signum, frame) -> None:
        # Runs between two bytecodes of the main thread: only note it; the work happens at the step boundary.
        if self.received is None:
            self.received = signum

    def count_optimizer_step(self) -> None:
        """Called by every optimizer step: a loop that never reaches a boundary is told so, once."""
        self._optimizer_steps += 1
        if self._optimizer_steps == 2 and self._boundaries == 0:
            warnings.warn(
                "handle_preemption: the optimizer steps outside `with accelerator.accumulate(model):`, where the "
                "checkpoint on SIGTERM/SIGUSR1 is taken; wrap each training step in it (free with one accumulation "
                "step), otherwise a preemption signal is only noted and the run is killed without a checkpoint",
                stacklevel=3,
            )

    def at_step_boundary(self) -> None:
        """Called at the end of every step that stepped the optimizer, on every rank."""
        self._boundaries += 1
        if not self._distributed:
            if self.received is not None:
                self._stop(self.received)
            return
        # The ranks' flags are reduced in the background during the next step, and read at the next boundary:
        # waiting for a round trip at every step would cost a collective's latency per step (measured in
        # benchmarks/preemption_overhead.py). Every rank reads the same reduction at the same boundary, so they
        # still stop together, one step later: at the second boundary after the signal.
        flag = self._flag
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            if int(flag.item()):
                self._stop(int(flag.item()))
        flag.fill_(self.received or 0)
        self._pending = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group,
                                                     async_op=True)

    def _stop(self, signum: int) -> None:
        accelerator = self.accelerator
        name = signal.Signals(signum).name
        got = [self.received is not None]
        if self._distributed:  # once, to name the ranks the signal reached
            got = [None] * accelerator.num_processes
            torch.distributed.all_gather_object(got, self.received is not None, group=self._group)
        path = accelerator.save_state()
        if accelerator.is_main_process:
            ranks = ", ".join(str(rank) for rank, received in enumerate(got) if received) or "none yet"
            print(f"hasten: {name} received (rank {ranks} of {accelerator.num_processes}); saved {path}; exiting "
                  f"with code {PREEMPTED_EXIT_CODE} so that the run is started again", file=sys.stderr, flush=True)
        if accelerator._tracking is not None:
            accelerator._tracking.finish()
        raise SystemExit(PREEMPTED_EXIT_CODE)


def handler_for(accelerator):
    """The installed handler when the accelerator's ProjectConfiguration asks for one, else None."""
    if not getattr(accelerator.project_configuration, "handle_preemption", False):
        return None
    return PreemptionHandler(accelerator).install()
