"""Tokenized corpora in other tools' formats, read in place.

* :mod:`~lightning_tune_data.formats.corpus`: the common description (per file: token dtype,
  where the ids are, document boundaries, optional loss mask) and :class:`TokenCorpus`, the table
  the train source reads;
* :mod:`~lightning_tune_data.formats.files`: where the files are (local path, glob, fsspec URL);
* :mod:`~lightning_tune_data.formats.detect`: which format they are in (``format: auto``);
* one reader per format: :mod:`~lightning_tune_data.formats.megatron`,
  :mod:`~lightning_tune_data.formats.datatrove`, :mod:`~lightning_tune_data.formats.dolma`,
  :mod:`~lightning_tune_data.formats.nanogpt` (nanoGPT and llm.c),
  :mod:`~lightning_tune_data.formats.litdata`, :mod:`~lightning_tune_data.formats.mds`; the
  delimiter scan the formats without an index share (:mod:`~lightning_tune_data.formats.delimited`),
  the copy of ids out of per-item headers (:mod:`~lightning_tune_data.formats.runs`) and what is
  kept of either (:mod:`~lightning_tune_data.formats.kept`);
* :mod:`~lightning_tune_data.formats.reading`: :func:`open_corpus`, any format;
* :mod:`~lightning_tune_data.formats.ranged`: :class:`RangedCorpus`, a remote corpus larger than its
  share of ``cache_budget``, read by byte ranges through the node's shard cache;
* :mod:`~lightning_tune_data.formats.store`: one of our committed stores by folder or URL.
"""

from lightning_tune_data.formats.corpus import CorpusFile, TokenCorpus
from lightning_tune_data.formats.options import FormatOptions
from lightning_tune_data.formats.ranged import RangedCorpus

__all__ = ["CorpusFile", "FormatOptions", "RangedCorpus", "TokenCorpus"]
