"""A config-built tiny GPT-2 and its token data for the Hugging Face tests (no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

VOCAB = 100


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB,
                                      n_positions=32, bos_token_id=0, eos_token_id=0))


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences, their own labels (the model shifts them)."""

    def __init__(self, n: int = 32, length: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def args(out: Path, **kw: Any) -> TrainingArguments:
    """CPU, no reporting, no checkpoints, no progress bars: only what the test asks for."""
    base: dict[str, Any] = dict(output_dir=str(out), per_device_train_batch_size=2,
                                num_train_epochs=1, learning_rate=1e-3, report_to=[],
                                save_strategy="no", disable_tqdm=True, use_cpu=True,
                                logging_strategy="steps", logging_steps=1,
                                dataloader_num_workers=0, seed=0)
    base.update(kw)
    return TrainingArguments(**base)
