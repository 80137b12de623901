"""Names that every stage of the data path agrees on, defined once.

A document travels from a source to the model as a dict; a batch as a dict of tensors plus a
``provenance`` side channel of plain lists (one entry per document). The keys of both, the label
value that means "no target here", and the allowed values of the run-wide options live here, so
that a source, the packer, a collator and the metrics can never disagree on a spelling.
"""

from __future__ import annotations

from typing import Literal

# -- a document, as a source yields it ------------------------------------------------------------
#: Token ids of one document (a 1-D integer array).
INPUT_IDS = "input_ids"
#: Optional per-token bool mask: ``True`` where the token is a training target.
LOSS_MASK = "loss_mask"
#: Name of the source the document came from.
SOURCE = "source"
#: Pass number of the source when the document was read (0 for the first pass).
EPOCH = "epoch"
#: Global row of the document in its source (``-1`` where it cannot be read again).
SOURCE_ROW = "source_row"
#: Tokens cut from the document by the overlong policy.
TRUNCATED_TOKENS = "truncated_tokens"
#: Documents the overlong policy dropped just before this one.
DROPPED_BEFORE = "dropped_before"

#: Column of a preprocessed row that failed under an error budget: ``None``, or why it failed
#: (such rows are dropped from a cache, and skipped and counted by a streaming source).
PREPROCESS_ERROR = "_preprocess_error"

# -- a batch, as a collator builds it -------------------------------------------------------------
LABELS = "labels"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
DOCUMENT_IDS = "document_ids"
SEQ_LENS = "seq_lens"
#: The batch's side channel: plain lists with one entry per document.
PROVENANCE = "provenance"

# -- a compact batch, as a train worker sends it (expanded into the keys above after transfer) --
#: Which compact layout a batch has (one of ``COMPACT_LAYOUTS``); absent from a full batch.
COMPACT_LAYOUT = "compact_layout"
#: ``[B, L]`` bool: ``True`` where the label is a target (sent only when some document masks targets).
TARGET_MASK = "target_mask"
#: ``[B]`` real tokens of each row of a compact padded batch.
ROW_LENGTHS = "row_lengths"
CompactLayout = Literal["packed", "padded"]
#: The compact layouts: packs (rows of documents, ``seq_lens``) and padded documents (one per row).
COMPACT_LAYOUTS: tuple[str, ...] = CompactLayout.__args__

# -- provenance: one entry per document of a batch ------------------------------------------------
TOKENS = "tokens"
ROW = "row"
NEW_DOCUMENT = "new_document"
#: Positions of the document (piece) whose label is a target, counted by the collator from the
#: batch's labels: ``0`` means the document adds nothing to the loss (e.g. a prompt that fills
#: ``max_seq_len``, so truncation left no completion token).
TARGET_TOKENS = "target_tokens"
#: Every provenance field, in the order collators write them.
PROVENANCE_FIELDS = (SOURCE, EPOCH, TOKENS, ROW, NEW_DOCUMENT, TRUNCATED_TOKENS, DROPPED_BEFORE, TARGET_TOKENS)

#: Label of a position with no target (document end, padding, masked prompt): ignored by the loss.
IGNORE_INDEX = -100
#: ``document_ids`` value of padding positions.
PAD_DOCUMENT_ID = -1

# -- allowed values of run-wide options -----------------------------------------------------------
OverlongPolicy = Literal["truncate", "drop"]
#: What happens to a document longer than ``max_seq_len``: cut it, or skip it (counted).
OVERLONG_POLICIES: tuple[str, ...] = OverlongPolicy.__args__

StoppingStrategy = Literal["infinite", "first_exhausted", "all_exhausted"]
#: When a finite mixture ends: never (sources restart), at the first exhausted source, or once all are.
STOPPING_STRATEGIES: tuple[str, ...] = StoppingStrategy.__args__

MixBy = Literal["documents", "tokens"]
#: What a mixture weight is a share of.
MIX_BY: tuple[str, ...] = MixBy.__args__

TokenizedFormat = Literal["auto", "lightning_tune_data", "megatron", "datatrove", "dolma", "nanogpt", "llmc", "litdata",
                          "mds"]
#: The formats a tokenized corpus is read from (``auto`` detects one from the files).
TOKENIZED_FORMATS: tuple[str, ...] = TokenizedFormat.__args__

TokenDtype = Literal["uint8", "int8", "uint16", "int16", "uint32", "int32", "int64"]
#: The token dtypes a tokenized corpus may hold.
TOKEN_DTYPES: tuple[str, ...] = TokenDtype.__args__

#: A document of a store read shard by shard is at ``shard << SHARD_BITS | position in that
#: shard's flat token values`` (a shard's values span less than 2**40 items).
SHARD_BITS = 40
#: The order of a store read through the node cache, saved with a source's position: rows per
#: block, and blocks per shuffle window (see ``sources/windowed_order.py``).
ORDER_BLOCK = "block_rows"
ORDER_WINDOW = "window_blocks"

ScheduleUnit = Literal["steps", "tokens"]
#: What the ``at`` of a mixture schedule's point counts: optimizer steps, or train tokens drawn.
SCHEDULE_UNITS: tuple[str, ...] = ScheduleUnit.__args__

Interpolation = Literal["step", "linear", "cosine"]
#: How a mixture schedule's weights go from one point to the next.
INTERPOLATIONS: tuple[str, ...] = Interpolation.__args__
