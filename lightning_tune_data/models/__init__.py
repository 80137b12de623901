"""The model side: the metric-group harness, per-source loss, the prediction writer and a tiny causal LM.

Everything here is importable from YAML configs after ``pip install``.
"""

from lightning_tune_data.models.tiny_lm import TinyCausalLM, document_causal_mask

__all__ = ["TinyCausalLM", "document_causal_mask"]
