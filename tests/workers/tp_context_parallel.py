"""cp_size=2 on 2 CUDA GPUs (tests/backends/test_tensor_parallel.py skips it elsewhere): inside maybe_context_parallel each rank
holds half of the sequence and causal SDPA over the group equals attention over the whole sequence."""

import torch
import torch.nn.functional as F

from hasten import Accelerator

from torch.distributed.tensor.experimental._attention import _cp_options

_cp_options.enable_load_balance = False  # rank r then holds the r-th contiguous half of the sequence
acc = Accelerator()
assert acc.parallelism_config.cp_size == 2 and acc.torch_device_mesh.mesh_dim_names == ("cp",)
assert acc.context_parallel_rank == acc.torch_device_mesh.get_local_rank("cp")
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 8, device=acc.device) for _ in range(3))
whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
with acc.maybe_context_parallel(buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
    assert q.shape[2] == 8  # this rank's part of the sequence
    part = F.scaled_dot_product_attention(q, k, v, is_causal=True)
parts = acc.gather(part.transpose(0, 2).contiguous()).transpose(0, 2)  # halves in rank order along the sequence
assert torch.allclose(parts, whole, atol=1e-4), (parts - whole).abs().max()
print(f"rank {acc.process_index}: context parallel checks passed")
