"""The errors of a source, and how the cause chain of a loading error is summarised."""

from __future__ import annotations

from lightning_tune_data.managers import CacheMissingError, DataSourceError
from lightning_tune_data.managers.errors import error_causes


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:  # noqa: BLE001 - returned for inspection
        return caught


def test_error_causes_lists_the_chain_up_to_the_limit_with_whitespace_collapsed() -> None:
    try:
        try:
            try:
                raise OSError("disk\n   full")
            except OSError as root:
                raise KeyError("shard") from root
        except KeyError:
            raise RuntimeError("load failed")  # implicit context
    except RuntimeError as error:
        top = error
    assert error_causes(top) == " (caused by KeyError: 'shard'; OSError: disk full)"
    assert error_causes(top, limit=1) == " (caused by KeyError: 'shard')"
    assert error_causes(raised(ValueError("alone"))) == ""


def test_a_cause_without_a_message_is_named_by_its_type() -> None:
    try:
        try:
            raise StopIteration
        except StopIteration as empty:
            raise ValueError("no rows") from empty
    except ValueError as error:
        assert error_causes(error) == " (caused by StopIteration)"


def test_the_errors_are_the_builtin_kinds_callers_catch() -> None:
    assert issubclass(DataSourceError, ValueError)
    assert issubclass(CacheMissingError, FileNotFoundError)
