"""Two processes save to an S3 bucket through tests/checkpoint/s3_fault_proxy.py (FAULT_PROXY: its URL).

    remote_faults.py s3://bucket/prefix

checkpoint_0 is saved while the proxy answers 503 SlowDown to 30% of the requests, checkpoint_1 while it resets 30%
of the connections; both must commit. Then every upload of checkpoint_2 fails: every rank must raise the same one
line, nothing committed; so must a refusal (403) of the claim, which only rank 0 writes. The newest committed checkpoint (checkpoint_1) then loads back bit-identical. Each rank
prints `REMOTE_FAULTS {json}`.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from s3_fault_proxy import set_faults  # noqa: E402

from hasten import Accelerator, ProjectConfiguration  # noqa: E402
from hasten.checkpoint.storage import storage_for  # noqa: E402


def snapshot(model, optimizer) -> dict:
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, per_param in optimizer.state_dict()["state"].items():
        state.update({f"opt.{i}.{k}": torch.as_tensor(v).clone() for k, v in per_param.items()})
    return state


def main(root: str) -> None:
    proxy = os.environ["FAULT_PROXY"]
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True,
                                                                  total_limit=3))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step():
        accelerator.backward(model(torch.randn(8, 64)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    def faults(**fields):
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            set_faults(proxy, **fields)
        accelerator.wait_for_everyone()

    for fault in ("503", "reset"):
        step()
        faults(fault=fault, rate=0.3)
        accelerator.save_state()
        faults(fault=None)
    saved = snapshot(model, optimizer)
    committed = storage_for(f"{root}/checkpoints").committed()
    step()
    faults(fault="503", rate=1.0, methods="PUT,POST", paths="checkpoint_2/")
    error = None
    try:
        accelerator.save_state()
    except Exception as raised:  # noqa: BLE001 - reported below
        error = f"{type(raised).__name__}: {raised}"
    faults(fault=None)
    # a refusal that is no fault to retry (403) where rank 0 alone talks to the store (the claim, at the start)
    faults(fault="403", rate=1.0, methods="PUT", paths=".hasten_writer.json")
    refused = None
    try:
        accelerator.save_state()
    except Exception as raised:  # noqa: BLE001 - reported below
        refused = f"{type(raised).__name__}: {raised}"
    faults(fault=None)
    accelerator.load_state()
    now = snapshot(model, optimizer)
    same = saved.keys() == now.keys() and all(torch.equal(saved[k], now[k]) for k in saved)
    report = json.dumps({"rank": accelerator.process_index, "committed_through_faults": committed,
                         "loaded_bit_identical": same, "error": error, "refused": refused})
    sys.stdout.write(f"REMOTE_FAULTS {report}\n")  # one write: the two ranks' lines do not interleave
    sys.stdout.flush()
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
