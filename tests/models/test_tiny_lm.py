"""TinyCausalLM: the document mask, packed == unpacked, the -100 convention and generation.

Batches are built with the package's own packer and collators, so the model is checked against
the real batch contract (shifted labels, restarting ``position_ids``, ``document_ids`` with -1
on padding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_tune_data import ByteTokenizer, PackedCollator, PaddedCollator
from lightning_tune_data.models import TinyCausalLM, document_causal_mask
from lightning_tune_data.sources.memory import InMemoryStream
from lightning_tune_data.packing.packer import IterablePackedDataset

TOKENIZER = ByteTokenizer()
DOCS = ["the first document", "a second, longer document about packing", "third"]


def encode(text: str) -> np.ndarray:
    return np.array([TOKENIZER.bos_id, *TOKENIZER.encode(text), TOKENIZER.eos_id], dtype=np.int64)


def make_model(**overrides) -> TinyCausalLM:
    torch.manual_seed(0)
    options = dict(vocab_size=TOKENIZER.vocab_size, max_seq_len=128, d_model=32, n_layers=2, n_heads=4)
    options.update(overrides)
    return TinyCausalLM(**options).eval()


def packed_batch(docs: list[np.ndarray], max_seq_len: int) -> dict:
    """All ``docs`` greedily packed into one row (in order) and collated with padding to 8."""
    stream = InMemoryStream(docs, "docs", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, max_seq_len=max_seq_len, strategy="greedy"))
    assert len(packs) == 1 and list(packs[0]["seq_lens"]) == [len(d) for d in docs]
    return PackedCollator(pad_id=TOKENIZER.pad_id, max_seq_len=max_seq_len, pad_to_multiple_of=8)(packs)


def padded_batch(docs: list[np.ndarray]) -> dict:
    samples = [{"input_ids": d, "source": "docs", "epoch": 0} for d in docs]
    return PaddedCollator(pad_id=TOKENIZER.pad_id)(samples)


def logits_of(model: TinyCausalLM, batch: dict) -> torch.Tensor:
    return model(batch["input_ids"], position_ids=batch.get("position_ids"),
                 document_ids=batch.get("document_ids"), attention_mask=batch.get("attention_mask"))


def test_document_causal_mask_is_causal_within_documents_and_never_onto_padding():
    document_ids = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0]])
    expected_packed = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],  # first token of document 1 sees only itself, not document 0
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # a padding query attends to itself only (no empty softmax row)
    ], dtype=torch.bool)

    mask = document_causal_mask(document_ids)

    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.bool
    assert torch.equal(mask[0, 0], expected_packed)
    assert torch.equal(mask[1, 0], torch.ones(6, 6, dtype=torch.bool).tril())
    assert not mask[0, 0, :, 5][:5].any(), "no real token may attend to padding"


def test_document_causal_mask_masks_each_row_on_its_own():
    # Rows are masked independently: document 0 of row 0 and document 0 of row 1 never mix.
    mask = document_causal_mask(torch.tensor([[0, 0, -1], [0, -1, -1]]))
    assert torch.equal(mask[0, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool))
    assert torch.equal(mask[1, 0], torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=torch.bool))


def test_logits_of_a_document_inside_a_packed_row_equal_its_logits_alone():
    docs = [encode(text) for text in DOCS]
    model = make_model()
    packed = packed_batch(docs, max_seq_len=128)
    alone = padded_batch(docs)

    with torch.no_grad():
        packed_logits = logits_of(model, packed)
        alone_logits = logits_of(model, alone)

    offset = 0
    for row, doc in enumerate(docs):
        n = len(doc)
        assert torch.equal(packed["input_ids"][0, offset:offset + n], alone["input_ids"][row, :n])
        assert torch.equal(packed["labels"][0, offset:offset + n], alone["labels"][row, :n])
        torch.testing.assert_close(packed_logits[0, offset:offset + n], alone_logits[row, :n], atol=1e-5, rtol=1e-5)
        offset += n


def test_packed_row_gives_the_same_loss_and_gradients_as_the_documents_unpacked():
    docs = [encode(text) for text in DOCS]
    model = make_model()

    def loss_sum_and_grads(batch: dict) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        outputs = model.step_outputs(batch)
        (outputs["loss"] * outputs["num_tokens"]).backward()
        return float((outputs["loss"] * outputs["num_tokens"]).detach()), [p.grad.clone() for p in model.parameters()]

    packed_loss, packed_grads = loss_sum_and_grads(packed_batch(docs, max_seq_len=128))
    alone_loss, alone_grads = loss_sum_and_grads(padded_batch(docs))

    assert packed_loss == pytest.approx(alone_loss, rel=1e-5)
    for packed_grad, alone_grad in zip(packed_grads, alone_grads, strict=True):
        torch.testing.assert_close(packed_grad, alone_grad, atol=1e-5, rtol=1e-4)


def test_without_document_ids_a_packed_row_leaks_attention_across_documents():
    # The control for the equivalence above: the same packed row read as one long document
    # (no document_ids, positions 0..L-1) gives the second document different logits.
    docs = [encode(text) for text in DOCS[:2]]
    model = make_model()
    packed = packed_batch(docs, max_seq_len=128)
    with torch.no_grad():
        masked = logits_of(model, packed)
        leaky = model(packed["input_ids"], attention_mask=packed["attention_mask"])
    first = len(docs[0])
    torch.testing.assert_close(masked[0, :first], leaky[0, :first], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(masked[0, first:first + len(docs[1])], leaky[0, first:first + len(docs[1])], atol=1e-3)


def test_loss_is_the_mean_cross_entropy_over_labels_that_are_not_minus_100():
    model = make_model()
    batch = padded_batch([encode(text) for text in DOCS])
    labels = batch["labels"].clone()
    labels[0, :4] = -100  # as if the first 4 targets were a masked prompt
    batch["labels"] = labels

    with torch.no_grad():
        outputs = model.step_outputs(batch)
        logits = logits_of(model, batch)

    kept = labels != -100
    assert int(outputs["num_tokens"]) == int(kept.sum())
    expected = F.cross_entropy(logits[kept], labels[kept])
    torch.testing.assert_close(outputs["loss"], expected, atol=1e-6, rtol=1e-6)


def test_padding_adds_nothing_to_the_loss_of_a_padded_batch():
    # Padding positions carry label -100: the batch's summed loss is the sum over its documents alone.
    model = make_model()
    docs = [encode(text) for text in DOCS]
    with torch.no_grad():
        batch_out = model.step_outputs(padded_batch(docs))
        singles = [model.step_outputs(padded_batch([doc])) for doc in docs]
    assert int(batch_out["num_tokens"]) == sum(int(o["num_tokens"]) for o in singles) == sum(len(d) - 1 for d in docs)
    batch_sum = float(batch_out["loss"] * batch_out["num_tokens"])
    assert batch_sum == pytest.approx(sum(float(o["loss"] * o["num_tokens"]) for o in singles), rel=1e-5)


def test_loss_of_a_batch_whose_labels_are_all_minus_100_is_zero_not_nan():
    model = make_model()
    batch = padded_batch([encode("only a prompt")])
    batch["labels"] = torch.full_like(batch["labels"], -100)
    with torch.no_grad():
        outputs = model.step_outputs(batch)
    assert int(outputs["num_tokens"]) == 0 and float(outputs["loss"]) == 0.0


def greedy(model: TinyCausalLM, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens


def test_predict_step_at_temperature_0_returns_each_prompt_followed_by_its_greedy_continuation():
    model = make_model(generate_tokens=5, temperature=0)
    prompts = [encode("hello")[:-1], encode("a much longer prompt than the first")[:-1]]
    batch = padded_batch(prompts)  # the short prompt is padded: padding must not leak into it

    with torch.no_grad():
        generated = model.predict_step(batch, batch_idx=0)

    assert len(generated) == len(prompts)
    for prompt, row in zip(prompts, generated):
        assert row[: len(prompt)] == prompt.tolist() and len(row) == len(prompt) + 5
        assert all(isinstance(t, int) and 0 <= t < TOKENIZER.vocab_size for t in row)
        assert row == greedy(model, prompt.tolist(), 5)


def test_greedy_predict_step_from_bos_only_prompts_generates_generate_tokens_ids():
    model = make_model(generate_tokens=4, temperature=0)
    batch = padded_batch([np.array([TOKENIZER.bos_id])] * 3)
    with torch.no_grad():
        generated = model.predict_step(batch, batch_idx=0)
    assert generated == [greedy(model, [TOKENIZER.bos_id], 4)] * 3


def test_sampled_predictions_from_identical_prompts_differ_and_are_reproducible_per_batch():
    model = make_model(generate_tokens=12)  # the defaults sample: temperature 0.8, top_k 40
    batch = padded_batch([np.array([TOKENIZER.bos_id])] * 4)
    with torch.no_grad():
        first = model.predict_step(batch, batch_idx=0)
        again = model.predict_step(batch, batch_idx=0)
        next_batch = model.predict_step(batch, batch_idx=1)
    assert len({tuple(row) for row in first}) == 4, "identical prompts must not give identical samples"
    assert all(len(row) == 13 and row[0] == TOKENIZER.bos_id for row in first)
    assert again == first
    assert next_batch != first


def test_top_k_samples_only_among_the_k_most_likely_tokens():
    model = make_model(temperature=5.0, top_k=2)  # a high temperature would otherwise reach any token
    logits = torch.arange(TOKENIZER.vocab_size, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    drawn = {model.next_token(logits, generator) for _ in range(200)}
    assert drawn == {TOKENIZER.vocab_size - 1, TOKENIZER.vocab_size - 2}
    assert make_model(temperature=0).next_token(logits) == TOKENIZER.vocab_size - 1


def test_sampling_options_are_checked_and_not_saved_with_the_model():
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        make_model(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        make_model(top_k=0)
    assert {"temperature", "top_k"}.isdisjoint(make_model(temperature=0.5, top_k=3).hparams)
