"""Preprocessing functions and dotted-path resolution."""

from __future__ import annotations

import pickle

import pytest

from lightning_tune_data.preprocess import (
    MissingColumnError,
    RowError,
    resolve_callable,
    tokenize_prompt_completion,
    tokenize_text,
)
from lightning_tune_data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()
BOS, EOS = TOK.bos_id, TOK.eos_id


def test_tokenize_text_wraps_each_document_in_bos_and_eos() -> None:
    out = tokenize_text({"text": ["ab", "é"], "id": [1, 2]}, TOK)
    assert out == {"input_ids": [[BOS, 97, 98, EOS], [BOS, 0xC3, 0xA9, EOS]]}


def test_tokenize_text_can_omit_bos_and_eos_and_read_another_column() -> None:
    out = tokenize_text({"body": ["hi"]}, TOK, text_column="body", add_bos=False, add_eos=False)
    assert out == {"input_ids": [[104, 105]]}


def test_tokenize_text_keeps_empty_strings_as_bos_eos_documents() -> None:
    assert tokenize_text({"text": [""]}, TOK) == {"input_ids": [[BOS, EOS]]}


def test_tokenize_text_none_row_raises_value_error_naming_column_and_row() -> None:
    with pytest.raises(ValueError, match=r"column 'text', row 1 of the batch: expected a string, got None"):
        tokenize_text({"text": ["ok", None, "ok"]}, TOK)


def test_tokenize_text_non_string_row_raises_naming_its_type() -> None:
    with pytest.raises(RowError) as info:
        tokenize_text({"text": ["ok", "ok", 42]}, TOK)
    assert (info.value.column, info.value.row) == ("text", 2)
    assert "got int" in str(info.value)


def test_tokenize_text_accepts_str_subclasses_like_plain_strings() -> None:
    class Text(str):
        pass

    assert tokenize_text({"text": [Text("ab"), "c"]}, TOK) == {"input_ids": [[BOS, 97, 98, EOS], [BOS, 99, EOS]]}


def test_tokenize_text_missing_column_lists_available_columns_and_the_kwarg() -> None:
    with pytest.raises(MissingColumnError) as info:
        tokenize_text({"body": ["x"], "id": [1]}, TOK)
    message = str(info.value)
    assert "column 'text' not found" in message
    assert "['body', 'id']" in message
    assert "text_column" in message
    assert isinstance(info.value, ValueError)


def test_row_and_missing_column_errors_survive_pickling_for_worker_processes() -> None:
    row = pickle.loads(pickle.dumps(RowError("text", 3, "bad")))
    col = pickle.loads(pickle.dumps(MissingColumnError("text", ["a"], "text_column")))
    assert (row.column, row.row, str(row)) == ("text", 3, "column 'text', row 3 of the batch: bad")
    assert (col.column, col.available, col.kwarg) == ("text", ["a"], "text_column")


def test_prompt_completion_masks_bos_and_prompt_and_trains_on_completion_and_eos() -> None:
    out = tokenize_prompt_completion(
        {"prompt": ["Q?", "hé"], "completion": ["A.", "ok"]}, TOK, separator=" "
    )
    assert out["input_ids"][0] == [BOS, *b"Q? ", *b"A.", EOS]
    assert out["loss_mask"][0] == [False] * 4 + [True] * 3
    # Multi-byte prompt: the mask boundary follows token counts, not characters.
    assert out["input_ids"][1] == [BOS, *"hé ".encode(), *b"ok", EOS]
    assert out["loss_mask"][1] == [False] * 5 + [True] * 3
    for ids, mask in zip(out["input_ids"], out["loss_mask"]):
        assert len(ids) == len(mask)


def test_prompt_completion_without_special_tokens_masks_only_the_prompt() -> None:
    out = tokenize_prompt_completion(
        {"q": ["ab"], "a": ["c"]}, TOK, prompt_column="q", completion_column="a",
        add_bos=False, add_eos=False,
    )
    assert out == {"input_ids": [[97, 98, 99]], "loss_mask": [[False, False, True]]}


def test_prompt_completion_none_completion_names_the_completion_column() -> None:
    with pytest.raises(RowError, match=r"column 'completion', row 0"):
        tokenize_prompt_completion({"prompt": ["p"], "completion": [None]}, TOK)


def test_prompt_completion_missing_column_names_completion_column_kwarg() -> None:
    with pytest.raises(MissingColumnError, match=r"completion_column"):
        tokenize_prompt_completion({"prompt": ["p"], "response": ["r"]}, TOK)


def test_resolve_callable_accepts_dotted_and_colon_paths_and_callables() -> None:
    assert resolve_callable("lightning_tune_data.preprocess.tokenize_text", "f") is tokenize_text
    assert resolve_callable("lightning_tune_data.preprocess:tokenize_text", "f") is tokenize_text
    assert resolve_callable(tokenize_text, "f") is tokenize_text
    encode = resolve_callable("lightning_tune_data.tokenizers:ByteTokenizer.encode", "f")
    assert encode is ByteTokenizer.encode
    assert resolve_callable("lightning_tune_data.tokenizers.ByteTokenizer.encode", "f") is encode


def test_resolve_callable_missing_module_names_field_path_and_import_error() -> None:
    with pytest.raises(ValueError) as info:
        resolve_callable("no_such_package_xyz.mod.fn", "preprocess_function")
    message = str(info.value)
    assert message.startswith("preprocess_function: cannot import 'no_such_package_xyz.mod.fn'")
    assert "ModuleNotFoundError" in message and "no_such_package_xyz" in message


def test_resolve_callable_missing_attribute_reports_attribute_error() -> None:
    with pytest.raises(ValueError, match=r"my_field: cannot import .*AttributeError.*no_such_fn"):
        resolve_callable("lightning_tune_data.preprocess.no_such_fn", "my_field")


def test_resolve_callable_rejects_non_callables_and_bare_names() -> None:
    with pytest.raises(ValueError, match=r"not callable"):
        resolve_callable("lightning_tune_data.__version__", "f")
    with pytest.raises(ValueError, match=r"not a dotted path"):
        resolve_callable("tokenize_text", "f")
    with pytest.raises(ValueError, match=r"expected a callable or a dotted path"):
        resolve_callable("", "f")


def test_resolve_callable_reports_errors_raised_inside_the_imported_module(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ltd_broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "ltd_needs_dep.py").write_text("import ltd_missing_dependency\ndef fn(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"RuntimeError: boom at import"):
        resolve_callable("ltd_broken_mod.fn", "preprocess_function")
    # A module that exists but imports a missing dependency: the dependency is named, rather
    # than claiming the module itself is missing.
    with pytest.raises(ValueError, match=r"No module named 'ltd_missing_dependency'"):
        resolve_callable("ltd_needs_dep.fn", "preprocess_function")
