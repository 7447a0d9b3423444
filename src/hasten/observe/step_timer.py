"""Where each training step's time goes, per rank: waiting for data, forward+backward, the optimizer step; and, in
a run of several processes, which rank is the slowest and whether it is a straggler. A hasten extension
(`Accelerator.track_step_times`); see docs/observability.md.

Off, it costs nothing: the hooks exist only while a `StepTimer` is attached. Attached, it adds two clock reads
around each batch fetch, each `accelerator.backward` and each optimizer step, and one small all-gather every
`log_every` steps (outside the timed steps).

The hooks, installed on the objects `prepare` returned and removed by `stop()`:
- a prepared data loader's class is swapped for a subclass whose `__iter__` times each fetch (the loader stays the
  same object, with the same state, and is still an instance of its class);
- an optimizer's and the Accelerator's `step`/`backward` get an instance attribute that wraps the method.

Under DDP every rank leaves `backward` together (gradients are all-reduced there), so a rank that is late makes
the others wait inside their `backward`, and every rank's step lasts as long. The straggler is therefore found
from each rank's *own* time, the step less its `backward`: data wait, forward, optimizer and other host work.
"""

from __future__ import annotations

import logging
import statistics
import time
import types

import torch

from ..state import GradientState

logger = logging.getLogger(__name__)

# Columns of one step's record, gathered across ranks as one float64 tensor.
_STEP, _DATA, _BACKWARD, _OPTIMIZER = range(4)
# A rank is only called a straggler when the time it costs the others is at least this share of a step.
_MIN_STRAGGLER_SHARE = 0.10

_timed_classes: dict[type, type] = {}


def _timed_loader_class(cls: type) -> type:
    """A subclass of the loader class `cls` whose iteration reports each fetch to the loader's step timer."""
    if cls in _timed_classes:
        return _timed_classes[cls]

    def __iter__(self):
        batches = super(timed, self).__iter__()
        timer, clock = self._hasten_step_timer, time.perf_counter
        try:
            while True:
                start = clock()
                try:
                    batch = next(batches)
                except StopIteration:
                    timer._end_of_data()
                    return
                timer._data(start, clock())
                yield batch
        finally:
            batches.close()

    timed = type(cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__,
                                        "__qualname__": cls.__qualname__, "_hasten_timed_from": cls})
    _timed_classes[cls] = timed
    return timed


class StepTimer:
    """Times every optimizer step of `accelerator`'s run and logs the breakdown every `log_every` steps through
    `accelerator.log` (start trackers with `init_trackers` to keep it). Use as a context manager, or call
    `stop()`; `watch(obj)` adds a loader or optimizer prepared later (e.g. one from `skip_first_batches`).

    A rank is flagged as a straggler when its own time per step exceeds `straggler_factor` times the median of
    the other ranks' and the difference is at least a tenth of a step.
    """

    def __init__(self, accelerator, log_every: int = 10, straggler_factor: float = 1.5, synchronize: bool = False,
                 prefix: str = "step_breakdown"):
        if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
            raise ValueError(f"track_step_times(log_every=...) must be a positive integer, got {log_every!r}")
        if not isinstance(straggler_factor, (int, float)) or straggler_factor <= 1:
            raise ValueError(
                f"track_step_times(straggler_factor=...) must be a number above 1, got {straggler_factor!r}")
        self.accelerator = accelerator
        self.log_every = log_every
        self.straggler_factor = float(straggler_factor)
        self.prefix = prefix
        # Host clocks see asynchronous CUDA work only where the host waits; synchronize=True puts it in its phase.
        self._synchronize = synchronize and accelerator.device.type == "cuda"
        self.history: list[dict] = []
        self.steps = 0
        self._records: list[list[float]] = []
        self._loaders, self._optimizers = [], []
        self._pending_optimizers: set[int] = set()
        self._backward_patched = False
        self._active = True
        self._reset_window()

    # -- attaching ------------------------------------------------------------------------------------------
    def start(self) -> "StepTimer":
        accelerator = self.accelerator
        if not accelerator._optimizers:
            raise RuntimeError("track_step_times() needs a prepared optimizer (a step ends at optimizer.step()); "
                               "call it after accelerator.prepare(...)")
        if getattr(accelerator, "_hasten_step_timer", None) is not None:
            raise RuntimeError("this Accelerator's steps are already timed by another StepTimer; stop() that one "
                               "first")
        accelerator._hasten_step_timer = self
        self._active = True
        self.watch(*accelerator._dataloaders, *accelerator._optimizers)
        if "backward" not in vars(accelerator):
            original = accelerator.backward

            def backward(loss, **kwargs):
                if not self._active:
                    return original(loss, **kwargs)
                start = self._now()
                original(loss, **kwargs)
                self._backward(start, self._now())

            accelerator.backward = self._timed_backward = backward
            self._backward_patched = True
        return self

    def watch(self, *objects) -> None:
        """Time these prepared data loaders and optimizers too."""
        for obj in objects:
            if isinstance(obj, torch.utils.data.DataLoader):
                self._watch_loader(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                self._watch_optimizer(obj)
            else:
                raise TypeError(f"StepTimer.watch takes prepared data loaders and optimizers, got {type(obj).__name__}")

    def _watch_loader(self, loader) -> None:
        if any(loader is known for known in self._loaders):
            return
        if getattr(loader, "_hasten_step_timer", None) is not None:
            raise RuntimeError("this data loader is already timed by another StepTimer; stop() that one first")
        loader._hasten_step_timer = self
        loader.__class__ = _timed_loader_class(type(loader))
        self._loaders.append(loader)

    def _watch_optimizer(self, optimizer) -> None:
        if any(optimizer is known for known, *_ in self._optimizers):
            return
        original = optimizer.step
        key = id(optimizer)
        gradient_state = GradientState()

        def step(_optimizer, *args, **kwargs):
            # Not timed: an accumulation micro-step (the wrapped step does nothing), or after stop() when a
            # scheduler made later wrapped this method and so it could not be taken away.
            if not self._active or not gradient_state.sync_gradients:
                return original(*args, **kwargs)
            start = self._now()
            result = original(*args, **kwargs)
            self._optimizer_step(key, start, self._now())
            return result

        # A bound method, as torch's LR schedulers expect when they wrap `optimizer.step` (`step.__func__`).
        timed = types.MethodType(step, optimizer)
        self._optimizers.append((optimizer, timed, original if "step" in vars(optimizer) else None))
        optimizer.step = timed
        self._pending_optimizers.add(key)

    def stop(self) -> None:
        """Remove every hook; steps after the last logged interval are not logged."""
        for loader in self._loaders:
            loader.__class__ = loader._hasten_timed_from
            del loader._hasten_step_timer
        for optimizer, timed, before in self._optimizers:
            if vars(optimizer).get("step") is timed:
                if before is not None:
                    optimizer.step = before
                else:
                    del optimizer.step
        if self._backward_patched and vars(self.accelerator).get("backward") is self._timed_backward:
            del self.accelerator.backward
        self._active = False
        self._loaders, self._optimizers, self._backward_patched = [], [], False
        if getattr(self.accelerator, "_hasten_step_timer", None) is self:
            del self.accelerator._hasten_step_timer

    def __enter__(self) -> "StepTimer":
        return self

    def __exit__(self, *exc_info) -> bool:
        self.stop()
        return False

    # -- the hooks ------------------------------------------------------------------------------------------
    def _now(self) -> float:
        if self._synchronize:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _reset_window(self, start: float | None = None) -> None:
        # Steps follow each other: the next one starts where this one ended (None: at its first timed event).
        self._window_start = start
        self._data_wait = self._backward_time = self._optimizer_time = 0.0
        self._pending_optimizers = {id(optimizer) for optimizer, *_ in getattr(self, "_optimizers", [])}

    def _data(self, start: float, end: float) -> None:
        if self._window_start is None:
            self._window_start = start
        self._data_wait += end - start

    def _end_of_data(self) -> None:
        # What runs between passes (evaluation, the end of an epoch) belongs to no training step.
        if self._optimizer_time == 0.0:
            self._reset_window()

    def _backward(self, start: float, end: float) -> None:
        if self._window_start is None:
            self._window_start = start
        self._backward_time += end - start

    def _optimizer_step(self, key: int, start: float, end: float) -> None:
        if self._window_start is None:
            self._window_start = start
        self._optimizer_time += end - start
        self._pending_optimizers.discard(key)
        if self._pending_optimizers:  # with several optimizers, a step ends when each has stepped
            return
        self._records.append([end - self._window_start, self._data_wait, self._backward_time, self._optimizer_time])
        self.steps += 1
        if len(self._records) >= self.log_every:
            self._flush()  # outside the timed steps: the next one starts after it
            end = self._now()
        self._reset_window(end)

    # -- logging --------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        from ..distributed.operations import gather

        accelerator = self.accelerator
        mine = torch.tensor(self._records, dtype=torch.float64)
        self._records = []
        ranks = accelerator.num_processes
        everyone = gather(mine.to(accelerator.device)).cpu() if ranks > 1 else mine
        values = summarize(everyone.view(ranks, -1, 4), self.straggler_factor, self.prefix)
        self.history.append(values)
        straggler = values.get(f"{self.prefix}/straggler_rank", -1)
        if straggler >= 0 and accelerator.is_main_process:
            logger.warning(
                "rank %d is a straggler: its own time is %.4f s per step against a median of %.4f s on the other "
                "ranks (data wait %.4f s), and the others wait for it", straggler,
                values[f"{self.prefix}/slowest_rank_own_s"], values[f"{self.prefix}/median_own_s"],
                values[f"{self.prefix}/slowest_rank_data_wait_s"],
            )
        accelerator.log(values, step=self.steps)


def summarize(records: torch.Tensor, straggler_factor: float, prefix: str = "step_breakdown") -> dict:
    """The logged values for `records` of shape (ranks, steps, 4): means over steps and ranks of each phase,
    and with several ranks the slowest rank (by its median own time per step: the step less its backward) and
    the straggler."""
    step, data, backward, optimizer = (records[..., column] for column in range(4))
    values = {
        f"{prefix}/step_s": step.mean().item(),
        f"{prefix}/data_wait_s": data.mean().item(),
        f"{prefix}/forward_backward_s": (step - data - optimizer).mean().item(),
        f"{prefix}/optimizer_s": optimizer.mean().item(),
    }
    ranks = records.shape[0]
    if ranks == 1:
        return values
    own = step - backward
    # The median step of each rank: a one-off wait (the first step of a pass synchronises the loaders' RNG) does
    # not make a straggler; a rank that is slow step after step does.
    per_rank = own.median(dim=1).values
    slowest = int(per_rank.argmax())
    others = [float(v) for rank, v in enumerate(per_rank) if rank != slowest]
    median_others = statistics.median(others)
    gap = float(per_rank[slowest]) - median_others
    is_straggler = (float(per_rank[slowest]) > straggler_factor * median_others
                    and gap >= _MIN_STRAGGLER_SHARE * step.mean().item())
    values.update({
        f"{prefix}/step_max_s": step.max().item(),
        f"{prefix}/slowest_rank": slowest,
        # In how many of the interval's steps that rank was the slowest one.
        f"{prefix}/slowest_rank_share": (own.argmax(dim=0) == slowest).double().mean().item(),
        f"{prefix}/slowest_rank_own_s": float(per_rank[slowest]),
        f"{prefix}/slowest_rank_data_wait_s": data[slowest].mean().item(),
        f"{prefix}/median_own_s": median_others,
        f"{prefix}/straggler_rank": slowest if is_straggler else -1,
    })
    return values


def track_step_times(accelerator, log_every: int = 10, straggler_factor: float = 1.5,
                     synchronize: bool = False) -> StepTimer:
    return StepTimer(accelerator, log_every=log_every, straggler_factor=straggler_factor,
                     synchronize=synchronize).start()


__all__ = ["StepTimer", "summarize", "track_step_times"]
