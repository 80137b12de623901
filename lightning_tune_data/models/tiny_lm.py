"""``TinyCausalLM``: a few-layer transformer for quickstarts and tests, aware of packed batches.

For packed batches it builds a block-diagonal causal mask from ``document_ids`` and uses
``position_ids`` that restart per document, so a token never attends across a document
boundary: packing changes throughput, not what the model learns.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_tune_data.keys import ATTENTION_MASK, DOCUMENT_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITION_IDS
from lightning_tune_data.models.harness import Harness, ReportedMetrics

__all__ = ["TinyCausalLM", "document_causal_mask"]


def document_causal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, 1, L, L]`` attention mask: causal, within one document, never onto padding.

    ``document_ids`` is ``[B, L]`` with ``-1`` on padding. Padding queries attend to themselves
    only, so no row of the mask is empty (an empty row makes softmax return NaN).

    Args:
        document_ids: ``[B, L]`` index of each position's document in its row, ``-1`` on padding.
    """
    length = document_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=document_ids.device).tril()
    same_document = document_ids[:, :, None] == document_ids[:, None, :]
    real_key = (document_ids >= 0)[:, None, :]
    mask = causal & same_document & real_key
    mask |= torch.eye(length, dtype=torch.bool, device=document_ids.device)
    return mask[:, None]


class _Block(nn.Module):
    """One pre-norm transformer block: masked self-attention, then an MLP, each with a residual.

    Args:
        d_model: Hidden width.
        n_heads: Attention heads.
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The block's output ``[B, L, d_model]``.

        Args:
            x: Hidden states ``[B, L, d_model]``.
            mask: Boolean attention mask ``[B, 1, L, L]`` (``True`` where a query may attend a key).
        """
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(Harness):
    """A tiny causal transformer LM trained on the datamodule's batch contract.

    Its step outputs include ``token_loss`` (the unreduced ``[B, L]`` loss), so training also logs
    ``train/<source>/loss`` per train source (see ``Harness``).

    Args:
        vocab_size: vocabulary size (the CLI links it from the datamodule's tokenizer).
        max_seq_len: longest sequence (positions); linked from the datamodule by the CLI.
        d_model: hidden width.
        n_layers: transformer blocks.
        n_heads: attention heads.
        learning_rate: AdamW learning rate.
        reported_metrics: named metric groups per stage (see ``Harness``).
        generate_tokens: tokens to generate per prompt in ``predict_step``.
        temperature: sampling temperature of ``predict_step``; ``0`` picks the most likely token
            every time (greedy: the same prompt always gives the same text). Not saved in
            checkpoints: set it where you predict (e.g. ``configs/predict.yaml``).
        top_k: ``predict_step`` samples among the ``top_k`` most likely tokens only (``None``: all).
            Not saved in checkpoints either.
    """

    def __init__(
        self,
        vocab_size: int = 259,
        max_seq_len: int = 512,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        learning_rate: float = 3e-3,
        reported_metrics: ReportedMetrics | None = None,
        generate_tokens: int = 32,
        temperature: float = 0.8,
        top_k: int | None = 40,
    ) -> None:
        super().__init__(reported_metrics)
        if temperature < 0:
            raise ValueError(f"TinyCausalLM: temperature must be >= 0 (0 = greedy), got {temperature}.")
        if top_k is not None and top_k < 1:
            raise ValueError(f"TinyCausalLM: top_k must be >= 1 or None (every token), got {top_k}.")
        # Sampling options are prediction settings, not part of the trained model: a checkpoint's
        # saved options would otherwise override what the predict config asks for.
        self.save_hyperparameters(ignore=["reported_metrics", "temperature", "top_k"])
        self.temperature = float(temperature)
        self.top_k = top_k
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, L, vocab]``. ``document_ids`` (packed) or ``attention_mask`` (padded) mask attention.

        Args:
            input_ids: ``[B, L]`` token ids.
            position_ids: ``[B, L]`` positions (restarting per document when packed); default ``0..L-1``.
            document_ids: ``[B, L]`` document index per position, ``-1`` on padding (packed batches).
            attention_mask: ``[B, L]`` 1 on real tokens, 0 on padding (padded batches).
        """
        if document_ids is None:
            real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            document_ids = torch.where(real, 0, -1)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        mask = document_causal_mask(document_ids)
        x = self.embed(input_ids) + self.positions(position_ids.clamp(max=self.positions.num_embeddings - 1))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))

    def step_outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``loss`` (mean over label tokens), ``num_tokens``, ``logits``, ``labels`` and the per-token ``token_loss``.

        Args:
            batch: A padded or packed batch.
        """
        logits = self(
            batch[INPUT_IDS],
            position_ids=batch.get(POSITION_IDS),
            document_ids=batch.get(DOCUMENT_IDS),
            attention_mask=batch.get(ATTENTION_MASK),
        )
        labels = batch[LABELS]
        num_tokens = (labels != IGNORE_INDEX).sum()
        token_loss = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view_as(labels)  # 0 where the label is ignored
        loss = token_loss.sum() / num_tokens.clamp(min=1)
        return {"loss": loss, "num_tokens": num_tokens, "logits": logits, "labels": labels, "token_loss": token_loss}

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> list[list[int]]:
        """Continue each prompt by ``generate_tokens`` tokens; returns the prompt and generated ids per row.

        Tokens are sampled with ``temperature`` among the ``top_k`` most likely (``temperature=0``:
        greedy). The draws are reproducible: they depend on the run's seed (``seed_everything``),
        the rank, the dataloader and the batch, so identical prompts (e.g. BOS-only ones) give
        different samples, on one rank and across ranks.

        Args:
            batch: A padded predict batch (prompts).
            batch_idx: Index of the batch in its dataloader.
            dataloader_idx: Index of the predict dataloader.
        """
        input_ids = batch[INPUT_IDS]
        lengths = batch[ATTENTION_MASK].sum(dim=1)
        seed = hash((torch.initial_seed(), self.global_rank, dataloader_idx, batch_idx)) % 2**63
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
        generated: list[list[int]] = []
        for row in range(input_ids.shape[0]):
            tokens = input_ids[row, : lengths[row]].tolist()
            for _ in range(self.hparams.generate_tokens):
                context = torch.tensor([tokens[-self.hparams.max_seq_len :]], device=input_ids.device)
                tokens.append(self.next_token(self(context)[0, -1], generator))
            generated.append(tokens)
        return generated

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> int:
        """The token that follows, from the last position's ``logits`` (``temperature``, ``top_k``).

        Args:
            logits: ``[vocab]`` logits of the next token.
            generator: the random generator to sample with (``None``: torch's global one).
        """
        if self.temperature == 0:
            return int(logits.argmax())
        scaled = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < scaled.numel():
            kth_largest = torch.topk(scaled, self.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
        return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over every parameter with ``learning_rate``."""
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate)
