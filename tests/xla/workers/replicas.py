"""Two XLA replicas (threads of one process, `xmp.spawn`, CPU_NUM_DEVICES=2) run one case of an Accelerate-style
script under hasten. Usage: python replicas.py train|collectives|checkpoint|late. Each replica prints `OK <ordinal>`.

Replica threads share torch's global CPU generator, so weights and data come from generators of their own."""

import os
import sys
import tempfile
import time

import torch
import torch_xla.distributed.xla_multiprocessing as xmp
from torch.utils.data import DataLoader, TensorDataset

N = 10  # samples: uneven over 2 replicas with batches of 2 (each gets 3 batches, 2 samples are padding)


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=generator)
    return x, x.sum(1, keepdim=True)


def setup(accumulation=1):
    from hasten import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(*data()), batch_size=2)
    return (accelerator, *accelerator.prepare(model, optimizer, loader))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train(index):
    accelerator, model, optimizer, loader = setup(accumulation=2)
    assert accelerator.num_processes == 2 and accelerator.process_index == index, accelerator.process_index
    assert accelerator.local_process_index == index  # Accelerate gives -1 off a TPU host
    seen, steps, firsts = [], 0, []
    for xb, yb in loader:
        firsts.append(xb.cpu())
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
            steps += accelerator.sync_gradients
            optimizer.step()
            optimizer.zero_grad()
        seen.append(accelerator.gather_for_metrics(xb).cpu())
    # sharding: this replica read its own batches
    x, _ = data()
    assert torch.equal(firsts[0], x[2 * index:2 * index + 2]), (index, firsts[0])
    # accumulation: 3 batches, steps after batch 2 and at the end of the loader (seen in the training thread)
    assert steps == 2, steps
    # gather_for_metrics: exactly the 10 samples, padding dropped
    seen = torch.cat(seen)
    assert seen.shape == (N, 3), seen.shape
    assert torch.equal(seen[seen[:, 0].argsort()], x[x[:, 0].argsort()])
    # data parallel: identical weights on both replicas after training
    both = accelerator.gather(flat(model)[None]).cpu()
    assert torch.equal(both[0], both[1]), both


def collectives(index):
    from hasten.utils import (
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
    )

    accelerator, *_ = setup()
    device = accelerator.device
    t = torch.tensor([float(index + 1)], device=device)
    assert gather(t).cpu().tolist() == [1.0, 2.0]
    assert reduce(t, "sum").cpu().tolist() == [3.0]
    assert reduce(t, "mean").cpu().tolist() == [1.5]
    assert reduce(t, "max").cpu().tolist() == [2.0]
    assert broadcast(t.clone(), from_process=1).cpu().tolist() == [2.0]
    assert gather_object([f"r{index}"]) == ["r0", "r1"]
    assert broadcast_object_list([{"from": index}], from_process=1) == [{"from": 1}]
    padded = pad_across_processes(torch.ones(index + 1, device=device), pad_index=-1)
    assert padded.cpu().tolist() == ([1.0, -1.0] if index == 0 else [1.0, 1.0]), padded
    assert accelerator.gather_for_metrics([index], use_gather_object=True) == [0, 1]
    with accelerator.split_between_processes(list(range(4))) as mine:
        assert mine == ([0, 1] if index == 0 else [2, 3]), mine
    accelerator.wait_for_everyone()


def checkpoint(index):
    accelerator, model, optimizer, loader = setup()
    folder = os.path.join(os.environ["HASTEN_XLA_TEST_DIR"], "ckpt")

    def one_epoch():
        for xb, yb in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
            optimizer.step()
            optimizer.zero_grad()
        return flat(model).cpu()

    one_epoch()
    accelerator.save_state(folder)
    accelerator.wait_for_everyone()
    assert os.path.isfile(os.path.join(folder, "model.safetensors"))
    after = one_epoch()
    accelerator.load_state(folder)
    again = one_epoch()
    assert torch.equal(after, again), (after, again)


def late(index):
    """Replica 1 reaches a collective 20 s after replica 0 (a busy machine; replica 0 alone writing a checkpoint).
    XLA's CPU rendezvous would end the process after ~15 s of waiting; hasten lines the replicas up before it."""
    from hasten.utils import reduce

    accelerator, *_ = setup()
    if index == 1:
        time.sleep(20)
    total = reduce(torch.tensor([float(index + 1)], device=accelerator.device), "sum")
    assert total.cpu().tolist() == [3.0], total


def main(index, case):
    {"train": train, "collectives": collectives, "checkpoint": checkpoint, "late": late}[case](index)
    print(f"OK {index}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HASTEN_XLA_TEST_DIR", tempfile.mkdtemp())
    xmp.spawn(main, args=(sys.argv[1],))
