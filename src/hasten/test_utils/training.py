"""A tiny regression problem for tests: y = a*x + b plus noise, and a two-parameter model that fits it."""

from __future__ import annotations

import numpy as np
import torch


class RegressionDataset:
    """`length` samples `{"x": float32, "y": float32}` with y = a*x + b + N(0, 0.1); `seed` fixes them."""

    def __init__(self, a=2, b=3, length: int = 64, seed=None):
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(torch.nn.Module):
    """`x * a + b` with scalar parameters `a` and `b`; prints the dtypes it sees on its first batch (tests read
    them to check mixed precision). With `double_output=True` it returns the prediction twice, as a tuple
    (Accelerate 1.15 accepts the flag and ignores it)."""

    def __init__(self, a=0, b=0, double_output: bool = False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.double_output = double_output
        self.first_batch = True

    def forward(self, x=None):
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        y = x * self.a + self.b
        return (y, y) if self.double_output else y


# -- Accelerate's MRPC loaders for its example tests -------------------------------------------------------------
# Accelerate's example tests swap an example's `get_dataloaders` for these. Like Accelerate's, they read the MRPC
# sample files at tests/test_samples/MRPC/{train,dev}.csv relative to the working directory (Accelerate's
# repository root) and load the tokenizer by its Hub name (from the local cache when offline). They use batch
# sizes 2 (train) and 1 (eval) whatever `batch_size` says, as Accelerate's do: the example tests count their steps
# and checkpoint folders with those sizes.
MRPC_FILES = {"train": "tests/test_samples/MRPC/train.csv", "validation": "tests/test_samples/MRPC/dev.csv"}


def _mrpc():
    from datasets import load_dataset

    return load_dataset("csv", data_files=MRPC_FILES)


def _is_xla(accelerator) -> bool:
    from ..core.enums import DistributedType

    return accelerator.distributed_type == DistributedType.XLA


def mocked_dataloaders(accelerator, batch_size: int = 16):
    """(train, eval) DataLoaders over the MRPC sample files, sentence pairs tokenized by `bert-base-cased`, padded
    to the tokenizer's maximum length and then per batch to the longest row; labels become `labels` ids."""
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
    raw = _mrpc()
    label_ids = {label: index for index, label in enumerate(raw["train"].unique("label"))}

    def encode(rows):
        encoded = tokenizer(rows["sentence1"], rows["sentence2"], truncation=True, max_length=None,
                            padding="max_length")
        if "label" in rows:
            encoded["labels"] = [label_ids[label] for label in rows["label"]]
        return encoded

    tokenized = raw.map(encode, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(rows):
        if _is_xla(accelerator):
            return tokenizer.pad(rows, padding="max_length", max_length=128, return_tensors="pt")
        return tokenizer.pad(rows, padding="longest", return_tensors="pt")

    return (DataLoader(tokenized["train"], shuffle=True, collate_fn=collate, batch_size=2),
            DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=1))


def mocked_dataloaders_for_autoregressive_models(accelerator, batch_size: int = 16):
    """(train, eval) DataLoaders for next-token prediction over the MRPC sample files' first sentences, tokenized
    by `HuggingFaceTB/SmolLM-360M` (padding with its end-of-text token): `input_ids` and `labels` are the padded
    ids shifted by one, padding in the labels is -100; mixed precision pads to a multiple of 8 (16 for fp8)."""
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM-360M")
    tokenizer.pad_token = tokenizer.eos_token
    raw = _mrpc()

    def encode(rows):
        return tokenizer(rows["sentence1"], truncation=True, max_length=None, return_attention_mask=False)

    with accelerator.main_process_first():
        tokenized = raw.map(encode, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(rows):
        longest = 128 if _is_xla(accelerator) else max(len(row["input_ids"]) for row in rows)
        multiple = {"no": None, "fp8": 16}.get(accelerator.mixed_precision, 8)
        batch = tokenizer.pad(rows, padding="max_length", max_length=longest + 1, pad_to_multiple_of=multiple,
                              return_tensors="pt")
        ids = batch["input_ids"]
        batch["input_ids"], labels = ids[:, :-1], ids[:, 1:]
        batch["labels"] = torch.where(labels == tokenizer.pad_token_id, -100, labels)
        if "attention_mask" in batch:
            batch["attention_mask"] = batch["attention_mask"][:, :-1]
        return batch

    return (DataLoader(tokenized["train"], shuffle=False, collate_fn=collate, batch_size=2),
            DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=1))
