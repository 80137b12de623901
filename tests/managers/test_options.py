"""SourceOptions: the options every manager shares, checked once, kept frozen."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from source_files import jsonl  # noqa: F401 - fixture

from lightning_tune_data.managers import (
    STAGES,
    DataSourceError,
    DatasetManager,
    LocalDatasetManager,
    SourceOptions,
    UnconditionalGenerationDatasetManager,
)
from lightning_tune_data.managers.options import (
    DEFAULT_PREPROCESS,
    STREAM_RETRY_DEFAULTS,
    TRANSFORM_ARGUMENTS,
    validate_stages,
    validate_stream_retries,
)
from lightning_tune_data.preprocess import tokenize_text


def arguments(**changes: object) -> dict:
    """A manager's option arguments at their defaults, with ``changes``."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(DatasetManager).parameters.items()}
    return {**defaults, **changes}


def upper_text(sample: dict) -> dict:
    return sample


def test_bad_preprocess_path_fails_at_construction_naming_field_and_path(jsonl: Path) -> None:
    with pytest.raises(DataSourceError) as info:
        LocalDatasetManager(data_files=str(jsonl), preprocess_function="no_such_pkg_xyz.tokenize")
    message = str(info.value)
    assert "preprocess_function: cannot import 'no_such_pkg_xyz.tokenize'" in message
    assert "ModuleNotFoundError" in message and "corpus.jsonl" in message


def test_unknown_preprocess_kwarg_lists_accepted_parameters(jsonl: Path) -> None:
    with pytest.raises(DataSourceError, match=r"preprocess_kwargs \['text_col'\] are not parameters.*'text_column'"):
        LocalDatasetManager(data_files=str(jsonl), preprocess_kwargs={"text_col": "body"})


def test_stages_default_to_all_and_unknown_stage_is_named(jsonl: Path) -> None:
    assert LocalDatasetManager(data_files=str(jsonl)).stages == list(STAGES)
    assert LocalDatasetManager(data_files=str(jsonl), stages=["fit", "validate"]).stages == ["fit", "validate"]
    with pytest.raises(DataSourceError, match=r"invalid: \['training'\]; each stage must be one of \['fit', 'validate', 'test', 'predict'\]"):
        LocalDatasetManager(data_files=str(jsonl), stages=["fit", "training"])
    with pytest.raises(DataSourceError, match=r"stages"):
        UnconditionalGenerationDatasetManager(num_examples=3, stages=["train"])


@pytest.mark.parametrize("manager", [DatasetManager, LocalDatasetManager])
def test_every_option_is_a_documented_keyword_argument_of_the_managers(manager: type) -> None:
    parameters = inspect.signature(manager).parameters
    option_arguments = [f.name for f in dataclasses.fields(SourceOptions) if f.name != "transforms"]
    for name in [*option_arguments, *TRANSFORM_ARGUMENTS]:
        assert name in parameters, name
        assert parameters[name].annotation is not inspect.Parameter.empty
        assert parameters[name].default == inspect.signature(DatasetManager).parameters[name].default
        assert name in (manager.__doc__ or ""), name


def test_from_arguments_normalises_the_values_it_keeps() -> None:
    options = SourceOptions.from_arguments("source s", arguments(
        weight=2, stages="fit", preprocess_kwargs={"add_eos": False}, columns_to_remove=("a",),
        load_kwargs={"revision": "main"}, stream_retries={"max_retries": 5.0}, filter_kwargs={"k": 1},
        message_transform=f"{__name__}.upper_text",
    ))
    assert options.weight == 2.0 and isinstance(options.weight, float)
    assert options.stages == ["fit"]
    assert options.preprocess_function == DEFAULT_PREPROCESS
    assert options.columns_to_remove == ["a"]
    assert options.transforms == {"message_transform": f"{__name__}.upper_text", "filter_kwargs": {"k": 1}}
    assert options.stream_retries == {**STREAM_RETRY_DEFAULTS, "max_retries": 5}
    assert options.stream_options() == {"max_retries": 5, "retry_backoff_s": 1.0, "retry_timeout_s": 300.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.weight = 3.0  # type: ignore[misc]


def test_the_defaults_describe_a_source_read_as_it_is() -> None:
    options = SourceOptions()
    assert (options.weight, options.preprocess_function, options.stages, options.shuffle) == (1.0, None, list(STAGES), True)
    assert options.stream_retries == STREAM_RETRY_DEFAULTS and options.stream_retries is not STREAM_RETRY_DEFAULTS


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"weight": float("nan")}, r"weight must be a finite number >= 0, got nan"),
        ({"num_proc": 0}, r"num_proc must be None or >= 1, got 0"),
        ({"max_error_count": -1}, r"max_error_count must be an integer >= 0, got -1"),
        ({"load_kwargs": ["x"]}, r"load_kwargs must be a mapping, got \['x'\]"),
        ({"load_kwargs": {"split": "train", "path": "x"}}, r"load_kwargs \['path', 'split'\] repeat arguments .*\(path, split\)"),
        ({"stream_retries": {"retries": 1}}, r"stream_retries must be a mapping with keys among"),
        ({"stream_retries": {"max_retries": -1}}, r"stream_retries.max_retries must be a number >= 0, got -1"),
        ({"preprocess_function": None, "preprocess_kwargs": {"a": 1}}, r"preprocess_kwargs \{'a': 1\} given but preprocess_function is None"),
        ({"filter_fn": "no_such_module_xyz.keep"}, r"source s: filter_fn: cannot import 'no_such_module_xyz.keep'"),
    ],
)
def test_from_arguments_names_the_source_and_the_bad_value(changes: dict, message: str) -> None:
    with pytest.raises((DataSourceError, ValueError), match=message) as info:
        SourceOptions.from_arguments("source s", arguments(**changes))
    assert str(info.value).startswith("source s")


def test_validate_stages_keeps_order_drops_repeats_and_rejects_an_empty_list() -> None:
    assert validate_stages(["test", "fit", "test"], "owner") == ["test", "fit"]
    with pytest.raises(DataSourceError, match=r"owner: stages \[\] invalid: empty list"):
        validate_stages([], "owner")
    assert validate_stream_retries(None, "s") == STREAM_RETRY_DEFAULTS
    with pytest.raises(DataSourceError, match=r"stream_retries.read_timeout_s must be a number >= 0, got True"):
        validate_stream_retries({"read_timeout_s": True}, "s")


def test_the_preprocess_function_resolves_from_its_path_and_is_described_by_it() -> None:
    by_path = SourceOptions.from_arguments("source s", arguments())
    assert by_path.resolve_preprocess_function("source s") is tokenize_text
    assert by_path.preprocess_label() == f"'{DEFAULT_PREPROCESS}'"
    by_callable = SourceOptions.from_arguments("source s", arguments(preprocess_function=tokenize_text))
    assert by_callable.preprocess_label() == "'lightning_tune_data.preprocess.tokenize_text'"
    identity = by_callable.preprocess_identity(tokenize_text)
    assert identity["function"]["qualname"] == "tokenize_text" and identity["kwargs"] == {}
    assert SourceOptions().preprocess_identity(None)["function"] is None


def test_stream_transforms_resolve_in_order_and_copy_the_filter_kwargs() -> None:
    options = SourceOptions.from_arguments("source s", arguments(
        filter_fn=f"{__name__}.upper_text", message_transform=upper_text, filter_kwargs={"k": 1}
    ))
    resolved = options.stream_transforms("source s")
    assert list(resolved) == ["message_transform", "filter_fn", "filter_kwargs"]
    assert resolved["filter_fn"] is upper_text and resolved["filter_kwargs"] == {"k": 1}
    assert resolved["filter_kwargs"] is not options.transforms["filter_kwargs"]


def test_stream_storage_options_time_out_silent_reads() -> None:
    options = SourceOptions.from_arguments("source s", arguments(stream_retries={"read_timeout_s": 7}))
    storage = options.stream_storage_options()
    assert set(storage) == {"http", "https"}
    timeout = storage["https"]["client_kwargs"]["timeout"]
    assert (timeout.total, timeout.sock_connect, timeout.sock_read) == (None, 7, 7)


def test_both_managers_keep_the_same_options_for_the_same_arguments(jsonl: Path) -> None:
    given = {"weight": 0.5, "stages": ["fit"], "shuffle": False, "max_error_count": 2, "num_proc": 2}
    hub = DatasetManager(path="json", split="train", data_files=str(jsonl), **given)
    local = LocalDatasetManager(data_files=str(jsonl), **given)
    assert hub.options == local.options
    assert (local.weight, local.stages, local.shuffle, local.max_error_count, local.streaming) == (0.5, ["fit"], False, 2, False)


def test_setting_a_weight_replaces_the_options_and_leaves_the_check_to_the_datamodule(jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl))
    before = manager.options
    manager.weight = -1.0
    assert manager.weight == -1.0 and manager.options.weight == -1.0
    assert before.weight == 1.0 and dataclasses.replace(manager.options, weight=1.0) == before
    assert repr(manager) == "LocalDatasetManager(json data_files=['corpus.jsonl'], weight=-1.0, stages=" + repr(list(STAGES)) + ")"
