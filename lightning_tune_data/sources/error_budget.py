"""``ErrorBudget``: how many failing samples a source skips before it stops, and what it reports.

User code (transforms, filters, a preprocess function) can fail on a few bad rows of a large
source. A source skips and counts such samples up to ``max_error_count``; the next failure stops
the run with the first failure's place and traceback, which is usually the one worth reading.
"""

from __future__ import annotations

import traceback

__all__ = ["ErrorBudget"]


class ErrorBudget:
    """The failures a source may skip, and the first one's report.

    Args:
        source: the source's name (for the error).
        max_error_count: failures skipped before the next one raises.
        failed: what failed, as the error says it after the count (``"samples failed their transforms"``).
        remedy: the error's last sentence: how to fix it.
    """

    def __init__(self, source: str, max_error_count: int, failed: str, remedy: str) -> None:
        self.source = source
        self.max_error_count = max_error_count
        self.failed = failed
        self.remedy = remedy
        self.first_failure: str | None = None

    def charge(self, errors: int, where: str) -> None:
        """Record a failure; call it while its exception is being handled (its traceback is kept).

        Args:
            errors: failures so far, this one included (the source keeps the count in its state).
            where: where it failed (``"row 5"``), for the report of the first failure.

        Raises:
            RuntimeError: ``errors`` is more than ``max_error_count``.
        """
        if self.first_failure is None:
            self.first_failure = f"{where}:\n{traceback.format_exc()}"
        if errors > self.max_error_count:
            raise RuntimeError(
                f"Source '{self.source}': {errors} {self.failed}, more than max_error_count={self.max_error_count}. "
                f"First failure at {self.first_failure}{self.remedy}"
            ) from None
