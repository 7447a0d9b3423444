"""Cut every batch along the sequence for hasten's Ulysses (`sp_backend="hasten"`): each rank of an sp group keeps
its 1/sp_size of the sequence (`hasten.distributed.sequence_parallel`).

The ranks of one sp group read the same batch (the mesh's data ranks leave sp out); the prepared loader's collate
function then pads the sequence on the right to a multiple of sp_size, adds what a slice no longer implies
(`position_ids` of the whole sequence, for rotary embeddings; `shift_labels`, the next-token targets, since the
last token of a slice predicts the first of the next), and keeps this rank's slice of each sequence-shaped entry.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..core.errors import ConfigError

# Entries of a batch that run along the sequence, with what pads them (None: the pad token id).
PAD_VALUES = {"input_ids": None, "labels": -100, "shift_labels": -100, "attention_mask": 0, "token_type_ids": 0,
              "loss_mask": 0, "position_ids": "continue", "inputs_embeds": 0.0}


def shard_sequence_batch(batch, rank: int, size: int, pad_token_id: int = 0, ignore_index: int = -100):
    """This rank's slice of a dict batch of (batch, seq, ...) entries (see the module text); other entries pass."""
    if not isinstance(batch, Mapping):
        raise ConfigError(f"sequence parallelism (sp_backend='hasten') cuts dict batches (input_ids, labels, ...), got "
                          f"a {type(batch).__name__}; fix: make the collate function return a dict")
    lead = batch.get("input_ids", batch.get("inputs_embeds"))
    if not isinstance(lead, torch.Tensor) or lead.ndim < 2:
        raise ConfigError("sequence parallelism (sp_backend='hasten') needs input_ids (or inputs_embeds) of shape "
                          "(batch, sequence) in every batch")
    rows, length = lead.shape[:2]
    out = dict(batch)
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ConfigError("sequence parallelism (sp_backend='hasten') needs right padding (attention is causal over "
                          "the whole sequence); this batch's attention_mask pads on the left; fix: "
                          "tokenizer.padding_side = 'right'")
    if "position_ids" not in out:
        out["position_ids"] = torch.arange(length, device=lead.device).expand(rows, length)
    labels = batch.get("labels")
    if "shift_labels" not in out and isinstance(labels, torch.Tensor):
        out["shift_labels"] = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=ignore_index)
    padded = -(-length // size) * size
    chunk = padded // size
    out = pad_sequence_batch(out, padded, pad_token_id, keys=PAD_VALUES)
    for key in PAD_VALUES:
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[1] == padded:
            out[key] = value[:, rank * chunk:(rank + 1) * chunk].contiguous()
    return out


def pad_sequence_batch(batch, length: int, pad_token_id: int = 0, keys=None) -> dict:
    """`batch` with each (batch, seq, ...) tensor padded on the right to `length` tokens (a new dict; the tensors
    already that long are kept): with `PAD_VALUES` for the entries it names (`position_ids` count on), 0 for any
    other. `keys`: pad only these entries. The sequence length is `input_ids`' (or `inputs_embeds`')."""
    lead = batch.get("input_ids", batch.get("inputs_embeds"))
    current = lead.shape[1]
    out = dict(batch)
    if length == current:
        return out
    for key, value in batch.items():
        if (keys is not None and key not in keys) or not isinstance(value, torch.Tensor) or value.ndim < 2 \
                or value.shape[1] != current:
            continue
        fill = PAD_VALUES.get(key, 0)
        extra = length - current
        if fill == "continue":
            tail = value[:, -1:] + torch.arange(1, extra + 1, device=value.device)
        else:
            shape = (value.shape[0], extra, *value.shape[2:])
            tail = torch.full(shape, pad_token_id if fill is None else fill, dtype=value.dtype, device=value.device)
        out[key] = torch.cat([value, tail], dim=1)
    return out


class SequenceShardCollate:
    """A collate function: the loader's own, then `shard_sequence_batch` for this rank."""

    def __init__(self, collate, rank: int, size: int, pad_token_id: int = 0):
        self.collate, self.rank, self.size, self.pad_token_id = collate, rank, size, pad_token_id

    def __call__(self, samples):
        return shard_sequence_batch(self.collate(samples), self.rank, self.size, self.pad_token_id)


def shard_loader(loader, config, rank: int, pad_token_id: int = 0):
    """Make a prepared loader yield slice `rank` of `config.sp_size` of each sequence (hasten's sp), in place;
    returns it. A loader sharded already is left as it is."""
    if not isinstance(loader.collate_fn, SequenceShardCollate):
        loader.collate_fn = SequenceShardCollate(loader.collate_fn, rank, config.sp_size, pad_token_id)
    return loader


__all__ = ["SequenceShardCollate", "pad_sequence_batch", "shard_loader", "shard_sequence_batch"]
