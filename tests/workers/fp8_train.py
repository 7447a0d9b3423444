"""fp8 (torchao) training tracks bf16 on a small transformer, and how long a step takes in each (GPU, cc >= 8.9).

Launched by tests/gpu/test_fp8_gpu.py (plain, or with --use_fsdp --fsdp_version 2, whose launcher default turns on
cpu_ram_efficient_loading). The same model, data and seed train `steps` steps in bf16, then in fp8; the main process
prints one JSON line with both loss curves and step times, and checks that fp8 tracked bf16: in every window of 10
steps, fp8's mean loss within 10% (+0.05 nats) of bf16's, and both runs end below half their first loss.

The CPU twin (CI): the same code path (torchao's Float8Linear, its scaling and casting to float8, torch's CPU
float8 matmul), a smaller model and fewer steps; the only thing skipped is the Accelerator's check that the device
can run fp8 (a CUDA GPU of compute capability >= 8.9), by name.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

from gpu_common import ON_GPU, device_only

from hasten import Accelerator
from hasten.state import AcceleratorState
from hasten.utils.ao import has_ao_layers

VOCAB, WIDTH, DEPTH, SEQ, BATCH = (512, 256, 4, 128, 16) if ON_GPU else (128, 64, 2, 32, 8)
if not ON_GPU:
    import hasten.training.fp8 as fp8_support

    device_only("the device runs fp8 kernels", "torch runs the float8 matmul on CPU", lambda: True)
    fp8_support.check_support = lambda device, backend: None


def synchronize():
    if ON_GPU:
        torch.cuda.synchronize()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).view(x.shape[0], x.shape[1], 3, 4, WIDTH // 4).unbind(2)
        attention = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(x.shape))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batches(steps, device):
    """A learnable synthetic language: each token is a fixed function of the one before."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
        tokens = [start]
        for _ in range(SEQ):
            tokens.append((tokens[-1] * 7 + 3) % VOCAB)
        sequence = torch.cat(tokens, dim=1).to(device)
        yield sequence[:, :-1], sequence[:, 1:]


def train(precision, steps):
    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(mixed_precision=precision)
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    if precision == "fp8":
        assert has_ao_layers(accelerator.unwrap_model(model)), "no Float8Linear after prepare"
    losses, times = [], []
    for step, (inputs, targets) in enumerate(batches(steps, accelerator.device)):
        synchronize()
        start = time.perf_counter()
        loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        synchronize()
        if step >= 10:  # after warm-up
            times.append(time.perf_counter() - start)
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return losses, sorted(times)[len(times) // 2], accelerator


def ram_efficient_loading(accelerator) -> bool:
    plugin = accelerator.state.fsdp_plugin
    return bool(plugin is not None and plugin.cpu_ram_efficient_loading)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    bf16_losses, bf16_time, _ = train("bf16", steps)
    fp8_losses, fp8_time, accelerator = train("fp8", steps)
    windows = [(sum(bf16_losses[i:i + 10]) / 10, sum(fp8_losses[i:i + 10]) / 10) for i in range(0, steps - 9, 10)]
    if accelerator.is_main_process:
        report = json.dumps({"distributed_type": str(accelerator.distributed_type), "bf16_losses": bf16_losses,
                             "fp8_losses": fp8_losses, "bf16_step_s": bf16_time, "fp8_step_s": fp8_time,
                             "fp8_over_bf16_step_time": fp8_time / bf16_time,
                             "ram_efficient_loading": ram_efficient_loading(accelerator)})
        # one write: print() writes the line and its newline apart, and the other rank's output can fall between
        sys.stdout.write(report + "\n")
        sys.stdout.flush()
    assert bf16_losses[-1] < bf16_losses[0] / 2 and fp8_losses[-1] < fp8_losses[0] / 2, (bf16_losses, fp8_losses)
    for index, (bf16, fp8) in enumerate(windows):
        assert abs(fp8 - bf16) <= 0.1 * bf16 + 0.05, f"steps {10 * index}-{10 * index + 9}: fp8 {fp8:.4f}, bf16 {bf16:.4f}"
    print("fp8 tracked bf16")


if __name__ == "__main__":
    main()
