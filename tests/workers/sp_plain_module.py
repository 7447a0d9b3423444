"""hasten's Ulysses (sp_size 2) with a model that is a plain `nn.Module` (no transformers config), on 2 processes,
launched by tests/distributed/test_sequence_parallel.py. Prints `ok <check> rank <r>`:

- refused: its attention, which hasten cannot find, would attend to each rank's slice only (the loss was off by
  3.6e-2 from one process on whole sequences): the first forward is refused in one line;
- wrapped: the same model with its attention function wrapped in `ulysses_attention` trains 3 steps to the loss
  and weights of one process on whole sequences.
"""

import torch
import torch.nn.functional as F
from sp_common import SEQ, VOCAB, collate, fresh_accelerator, max_diff, samples

from hasten import ParallelismConfig
from hasten.core.errors import ConfigError
from hasten.distributed.sequence_parallel import causal_lm_loss, ulysses_attention

TOL, STEPS, LR, HEADS, DIM = 1e-5, 3, 0.2, 2, 16


def attend(module, query, key, value, attention_mask=None, **kwargs):
    """transformers' attention layout: (batch, heads, seq, dim) in, (batch, seq, heads, dim) out."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=attention_mask is None)
    return out.transpose(1, 2), None


class TinyDecoder(torch.nn.Module):
    def __init__(self, attention=attend):
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(64, DIM)
        self.qkv, self.out, self.head = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM), torch.nn.Linear(DIM, VOCAB)
        self.attention = attention

    def forward(self, input_ids, position_ids, attention_mask=None):
        x = self.tokens(input_ids) + self.positions(position_ids)
        rows, length = input_ids.shape
        q, k, v = (t.reshape(rows, length, HEADS, DIM // HEADS).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        attended, _ = self.attention(self, q, k, v)
        return self.head(x + self.out(attended.reshape(rows, length, DIM)))


def ok(name):
    print(f"ok {name} rank {torch.distributed.get_rank()}", flush=True)


data = samples(STEPS, variable=False)
for name, attention in (("refused", attend), ("wrapped", ulysses_attention(attend))):
    acc = fresh_accelerator(parallelism_config=ParallelismConfig(sp_size=2, sp_backend="hasten"))
    model = TinyDecoder(attention)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, dl = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=1, collate_fn=collate))
    losses = []
    try:
        for batch in dl:
            assert batch["input_ids"].shape[1] == SEQ // 2
            loss = causal_lm_loss(model(batch["input_ids"], batch["position_ids"]), batch["shift_labels"])
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    except ConfigError as error:
        assert name == "refused", error
        text = str(error)
        assert "\n" not in text and "ran without hasten's sequence-parallel attention" in text, text
        assert "ulysses_attention" in text and "TinyDecoder" in text, text
        ok(name)
        continue
    assert name == "wrapped", f"a plain nn.Module trained under sp_size=2 without its attention seeing the sequence: {losses}"
    reference = TinyDecoder()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    for step, rows in enumerate(data):
        batch = collate([rows])
        logits = reference(batch["input_ids"], torch.arange(SEQ)[None])
        shift = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), shift.reshape(-1), ignore_index=-100)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert abs(loss.item() - losses[step]) <= TOL, (step, loss.item(), losses[step])
    weights = acc.unwrap_model(model).state_dict()
    difference = max_diff(weights, reference.state_dict())
    assert difference <= TOL, difference
    ok(name)
