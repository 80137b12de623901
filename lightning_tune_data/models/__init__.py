"""Small models that ship with the package (importable from YAML configs after ``pip install``)."""

from .tiny_lm import TinyCausalLM, document_causal_mask

__all__ = ["TinyCausalLM", "document_causal_mask"]
