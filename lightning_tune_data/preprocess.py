"""Preprocessing functions, run once per source by ``Dataset.map(batched=True)`` in ``prepare_data``.

A preprocessing function has the signature::

    fn(examples: dict[str, list], tokenizer: Tokenizer, **kwargs) -> dict[str, list]

``examples`` is a batch of rows in column form (``{"text": [...], "id": [...]}``). It returns
``{"input_ids": [[...], ...]}`` and optionally ``"loss_mask"`` (one bool per token, ``True``
where the token is a training target). The number of output rows may differ from the number of
input rows (filtering, chunking). Functions are referred to from YAML by dotted path
(``lightning_tune_data.preprocess.tokenize_text``), resolved by :func:`resolve_callable`.

Bad data raises clear errors: :class:`MissingColumnError` when a column is absent and
:class:`RowError` for a bad row; the dataset manager adds the source name and the global row
index, and turns them into :class:`PreprocessError`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_tune_data.tokenizers import Tokenizer

__all__ = [
    "MissingColumnError",
    "PreprocessError",
    "RowError",
    "resolve_callable",
    "tokenize_prompt_completion",
    "tokenize_text",
]


class PreprocessError(ValueError):
    """Preprocessing a source failed; the message names the source, the rows and the fix."""


class MissingColumnError(ValueError):
    """A preprocessing function needs a column the data does not have.

    Args:
        column: The missing column.
        available: The columns the batch does have.
        kwarg: The keyword argument of the preprocessing function that names the column
            (``"text_column"``), so the fix can be spelled out.
    """

    def __init__(self, column: str, available: Sequence[str], kwarg: str | None = None) -> None:
        self.column = column
        self.available = list(available)
        self.kwarg = kwarg
        hint = f" Set preprocess_kwargs: {{{kwarg}: ...}}." if kwarg else ""
        super().__init__(f"column '{column}' not found; available columns: {self.available}.{hint}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.column, self.available, self.kwarg))


class RowError(ValueError):
    """One row of a batch is unusable (e.g. its text is ``None``).

    Args:
        column: The column holding the bad value.
        row: Position of the row *within the batch*; the manager maps it to a dataset index.
        problem: What is wrong with the value.
    """

    def __init__(self, column: str, row: int, problem: str) -> None:
        self.column = column
        self.row = row
        self.problem = problem
        super().__init__(f"column '{column}', row {row} of the batch: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.column, self.row, self.problem))


def _column(examples: Mapping[str, list], column: str, kwarg: str) -> list:
    if column not in examples:
        raise MissingColumnError(column, list(examples), kwarg)
    return examples[column]


def _text(value: Any, column: str, row: int) -> str:
    if value is None:
        raise RowError(column, row, "expected a string, got None (missing value)")
    if not isinstance(value, str):
        raise RowError(
            column, row, f"expected a string, got {type(value).__name__} ({str(value)[:80]!r})"
        )
    return value


def tokenize_text(
    examples: dict[str, list],
    tokenizer: Tokenizer,
    text_column: str = "text",
    add_bos: bool = True,
    add_eos: bool = True,
) -> dict[str, list]:
    """Tokenize one text column into ``input_ids`` (every token is a training target).

    Args:
        examples: A batch of rows in column form.
        tokenizer: The tokenizer (``encode`` adds no special tokens).
        text_column: Column holding the text.
        add_bos: Prepend ``tokenizer.bos_id`` to every document.
        add_eos: Append ``tokenizer.eos_id`` to every document.

    Returns:
        ``{"input_ids": [[int, ...], ...]}``, one list per row.

    Raises:
        MissingColumnError: ``text_column`` is not in the batch.
        RowError: A row's text is ``None`` or not a string.
    """
    texts = _column(examples, text_column, "text_column")
    prefix = [tokenizer.bos_id] if add_bos else []
    suffix = [tokenizer.eos_id] if add_eos else []
    if not set(map(type, texts)) <= {str}:  # the common case (plain strings) needs no per-row check
        texts = [_text(text, text_column, row) for row, text in enumerate(texts)]
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:  # one call for the whole batch (parallel in the tokenizers library)
        return {"input_ids": [[*prefix, *ids, *suffix] for ids in encode_batch(texts)]}
    return {"input_ids": [[*prefix, *tokenizer.encode(text), *suffix] for text in texts]}


def tokenize_prompt_completion(
    examples: dict[str, list],
    tokenizer: Tokenizer,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    separator: str = "",
    add_bos: bool = True,
    add_eos: bool = True,
) -> dict[str, list]:
    """Tokenize instruction/chat pairs with prompt masking.

    The document is ``[BOS] prompt separator completion [EOS]``. ``loss_mask`` is ``False`` on
    BOS, the prompt and the separator (the model is not trained to produce them) and ``True`` on
    the completion and EOS.

    Args:
        examples: A batch of rows in column form.
        tokenizer: The tokenizer (``encode`` adds no special tokens).
        prompt_column: Column holding the prompt / instruction.
        completion_column: Column holding the response the model is trained on.
        separator: Text put between prompt and completion (masked like the prompt).
        add_bos: Prepend ``tokenizer.bos_id`` (masked).
        add_eos: Append ``tokenizer.eos_id`` (a target, so the model learns to stop).

    Returns:
        ``{"input_ids": [[int, ...]], "loss_mask": [[bool, ...]]}`` with equal lengths per row.

    Raises:
        MissingColumnError: A column is not in the batch.
        RowError: A prompt or completion is ``None`` or not a string.
    """
    prompts = _column(examples, prompt_column, "prompt_column")
    completions = _column(examples, completion_column, "completion_column")
    all_ids: list[list[int]] = []
    all_masks: list[list[bool]] = []
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        context = ([tokenizer.bos_id] if add_bos else []) + list(
            tokenizer.encode(_text(prompt, prompt_column, row) + separator)
        )
        target = list(tokenizer.encode(_text(completion, completion_column, row)))
        if add_eos:
            target.append(tokenizer.eos_id)
        all_ids.append(context + target)
        all_masks.append([False] * len(context) + [True] * len(target))
    return {"input_ids": all_ids, "loss_mask": all_masks}


def resolve_callable(spec: str | Callable, field: str) -> Callable:
    """Turn a dotted path (``"pkg.mod.fn"`` or ``"pkg.mod:fn"``) or a callable into a callable.

    Args:
        spec: The callable itself, or a dotted path to it. With ``":"`` the part before it is
            the module and the part after it the attribute path (``"pkg.mod:Class.method"``);
            without it, the longest importable module prefix is used.
        field: The configuration field being resolved (``"preprocess_function"``); it is named
            in error messages.

    Returns:
        The callable.

    Raises:
        ValueError: The path is malformed, cannot be imported, or names something that is not
            callable. The message names ``field``, the path and the underlying error.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"{field}: expected a callable or a dotted path like 'package.module.function', "
            f"got {spec!r}."
        )
    spec = spec.strip()
    fix = (
        f"Give {field} as an importable dotted path 'package.module.function' (or "
        f"'package.module:function'); the module must be importable: lightning-tune-data "
        f"imports from the directory it runs in, for a module elsewhere add its folder to "
        f"PYTHONPATH."
    )
    if ":" in spec:
        module_name, _, attr_path = spec.partition(":")
        candidates = [(module_name, attr_path.split(".") if attr_path else [])]
    else:
        parts = spec.split(".")
        if len(parts) < 2:
            raise ValueError(f"{field}: '{spec}' is not a dotted path. {fix}")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    module = None
    attrs: list[str] = []
    first_error: BaseException | None = None
    for module_name, attrs in candidates:
        try:
            module = importlib.import_module(module_name)
            break
        except ModuleNotFoundError as error:
            # Only "this prefix is not a module" means: try a shorter prefix. A module that
            # exists but fails to import (a missing dependency inside it) is reported as is.
            missing = error.name or ""
            if not (module_name == missing or module_name.startswith(missing + ".")):
                raise ValueError(
                    f"{field}: cannot import '{spec}': importing module '{module_name}' failed "
                    f"with ModuleNotFoundError: {error}. {fix}"
                ) from error
            first_error = first_error or error
        except Exception as error:  # noqa: BLE001 - any import-time failure is reported
            raise ValueError(
                f"{field}: cannot import '{spec}': importing module '{module_name}' failed with "
                f"{type(error).__name__}: {error}. {fix}"
            ) from error
    if module is None:
        raise ValueError(
            f"{field}: cannot import '{spec}': {type(first_error).__name__}: {first_error}. {fix}"
        ) from first_error
    obj: Any = module
    for attr in attrs:
        try:
            obj = getattr(obj, attr)
        except AttributeError as error:
            raise ValueError(
                f"{field}: cannot import '{spec}': AttributeError: {error}. {fix}"
            ) from error
    if not attrs or not callable(obj):
        raise ValueError(f"{field}: '{spec}' resolves to {obj!r}, which is not callable. {fix}")
    return obj
