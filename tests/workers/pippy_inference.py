"""prepare_pippy on N processes: a model cut into N stages gives the same output as the whole model in one process.

Run through `hasten launch` (see tests/test_inference.py). Prints `CHECKS-PASSED <rank> <count>`.
"""

import torch

from hasten import PartialState
from hasten.inference import prepare_pippy

state = PartialState()
rank, world = state.process_index, state.num_processes
checks = 0


def check(condition, what):
    global checks
    assert condition, f"rank {rank}: {what}"
    checks += 1


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.lin(self.norm(x)))


class Net(torch.nn.Module):
    def __init__(self, width=16, depth=4):
        super().__init__()
        self.embed = torch.nn.Linear(6, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


torch.manual_seed(0)
model = Net().eval()
batch = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    expected = model(batch)  # the whole model, in this one process
    expected_twice = model(batch * 2)

# 1. automatic split points, last rank returns the output
prepare_pippy(model, example_args=(batch,))
check(len(model.hf_split_points) == world - 1, f"split points {model.hf_split_points}")
check(model.hf_split_points[0].startswith("blocks."), f"auto split falls between blocks: {model.hf_split_points}")
stage_params = sum(p.numel() for p in model.pippy_stage._stage.submod.parameters())
whole_params = sum(p.numel() for p in Net().parameters())
check(0 < stage_params < whole_params, f"each process holds one stage only ({stage_params} of {whole_params})")
with torch.no_grad():
    output = model(batch)
if rank == world - 1:
    check(torch.allclose(output, expected, atol=1e-5), f"pipelined output differs: {(output - expected).abs().max()}")
else:
    check(output is None, "only the last stage returns the output")
with torch.no_grad():
    again = model(batch * 2)
if rank == world - 1:
    check(torch.allclose(again, expected_twice, atol=1e-5), "a second batch runs through the same pipeline")

# 2. explicit split point, more micro-batches than stages, output gathered on every rank
torch.manual_seed(0)
model2 = Net().eval()
prepare_pippy(model2, split_points=["blocks.1"], example_args=(batch,), num_chunks=4, gather_output=True)
with torch.no_grad():
    output2 = model2(batch)
check(torch.allclose(output2, expected, atol=1e-5), "gather_output: every rank gets the output")

# 3. inputs given by keyword, as transformers models take them
class KeywordNet(Net):
    def forward(self, input_ids):
        return super().forward(input_ids)


torch.manual_seed(0)
model3 = KeywordNet().eval()
prepare_pippy(model3, example_kwargs={"input_ids": batch}, gather_output=True)
with torch.no_grad():
    output3 = model3(input_ids=batch)
check(torch.allclose(output3, expected, atol=1e-5), "keyword inputs flow through the pipeline")

# 4. an example batch that does not split into the micro-batches is refused on every rank, before any collective
try:
    prepare_pippy(Net().eval(), example_args=(torch.randn(3, 6),), num_chunks=2)
except ValueError as error:
    check("multiple of 2" in str(error), str(error))
else:
    check(False, "an odd example batch was accepted")

print(f"CHECKS-PASSED {rank} {checks}", flush=True)
