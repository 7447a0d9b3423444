"""Step: hasten's Ulysses sequence parallelism (`sp_backend="hasten"`, sp_size > 1). On the model as the script built
it, before precision and wrapping: its attention is routed through the all-to-all that gathers the whole sequence
(`distributed/sequence_parallel.py`). On each prepared loader: every sp rank keeps its slice of the sequence
(`data/sequence_shard.py`). DeepSpeed's own Ulysses (`sp_backend="deepspeed"`) is built by its engine instead
(`backends/deepspeed/ulysses.py`)."""

from __future__ import annotations


def enabled(layout) -> bool:
    """Whether `layout` (the plan's ParallelismConfig, or None) asks for hasten's sequence parallelism."""
    return layout is not None and layout.native_sp_enabled


def apply_sp(model, layout) -> None:
    """Route `model`'s attention over the whole sequence when the layout asks for it; else nothing."""
    if enabled(layout):
        from ..distributed.sequence_parallel import prepare_model

        prepare_model(model)


def shard_loader(loader, layout, mesh) -> None:
    """Make a prepared loader yield this rank's sequence slices (its rank along `mesh`'s sp dimension), in place,
    when the layout asks for it; else nothing."""
    if enabled(layout):
        from ..data.sequence_shard import shard_loader as shard

        shard(loader, layout, mesh.get_local_rank("sp"))
