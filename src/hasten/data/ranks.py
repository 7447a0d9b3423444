"""Which data-parallel rank this process is: on a mesh, ranks that differ only along tensor, context, sequence or
pipeline dimensions read the same batch, so the loaders shard, and metrics gather, over the data dimensions only."""

from __future__ import annotations

from ..core.errors import ConfigError


def data_ranks(mesh) -> tuple[int, int]:
    """(number of different batches, which one this process reads) on `mesh`: ranks that differ only along
    tensor/context dimensions read the same batch."""
    size, index = 1, 0
    for position, name in enumerate(mesh.mesh_dim_names or ()):
        if name in ("dp_replicate", "dp_shard"):
            width = mesh.size(position)
            index = index * width + mesh.get_local_rank(name)
            size *= width
    return size, index


def mesh_data_sharding(mesh, dispatch_batches):
    """(num_processes, process_index, dispatch_batches) for `prepare_data_loader(torch_device_mesh=mesh)`."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise ConfigError(f"torch_device_mesh must be a torch DeviceMesh (e.g. accelerator.torch_device_mesh), got "
                          f"{type(mesh).__name__}")
    size, index = data_ranks(mesh)
    if splits_data_ranks(mesh):
        shared = [name for i, name in enumerate(mesh.mesh_dim_names or ())
                  if name in ("pp", "cp", "sp") and mesh.size(i) > 1]
        if dispatch_batches and shared:
            raise ConfigError(f"dispatch_batches=True gives every tensor-parallel group one slice of a batch, but not yet "
                              f"under {'/'.join(shared)} parallelism; fix: DataLoaderConfiguration(dispatch_batches=False)")
        if dispatch_batches is None:
            dispatch_batches = False  # an iterable dataset is sharded by data-parallel rank instead of dispatched
    return size, index, dispatch_batches


def data_parallel_size(state) -> int:
    """How many different batches the processes of a run read in one step (the number of processes, unless tensor or
    context parallel ranks share theirs)."""
    mesh = getattr(state, "device_mesh", None)
    return data_ranks(mesh)[0] if splits_data_ranks(mesh) else state.num_processes


def run_shares_batches() -> bool:
    """Whether this run's ranks of one tensor/context group read the same batches (they must then shuffle alike)."""
    from ..state import AcceleratorState

    return splits_data_ranks(AcceleratorState._shared_state.get("device_mesh"))


def splits_data_ranks(mesh) -> bool:
    """Whether some ranks of `mesh` share a batch (a tensor or context dimension above 1)."""
    return mesh is not None and any(name in ("pp", "tp", "cp", "sp") and mesh.size(i) > 1
                                    for i, name in enumerate(mesh.mesh_dim_names or ()))


def gather_data_parallel(data, as_objects: bool):
    """`gather_for_metrics`'s gather: across the data-parallel ranks only when ranks of one tensor/context group hold
    the same samples (their copies would otherwise be counted tp_size times); across all processes otherwise."""
    from ..distributed.operations import gather, gather_object
    from ..state import AcceleratorState

    state = AcceleratorState._shared_state
    mesh = state.get("device_mesh")
    if not splits_data_ranks(mesh):
        return gather_object(data) if as_objects else gather(data)
    import torch
    import torch.distributed as dist

    config = state["parallelism_config"]
    group = config.submesh("dp").get_group() if config.dp_dim_names else None
    if group is None:
        return data if not as_objects else (list(data) if isinstance(data, (list, tuple)) else [data])
    if as_objects:
        parts = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, data, group=group)
        return [item for part in parts for item in (part if isinstance(part, (list, tuple)) else [part])]
    from ..core.nested import recursively_apply

    def gather_one(tensor):
        tensor = tensor.contiguous() if tensor.ndim else tensor.reshape(1)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor, group=group)
        return torch.cat(parts)

    return recursively_apply(gather_one, data)
