"""Third-party warnings every run would print about code that is not the user's, and their filter.

torchdata's ``StatefulDataLoader`` calls a deprecated torch function when it is built, and
Lightning's pytree helper uses a deprecated torch check when it wraps the dataloaders. Neither is
something a user of this package can act on, so the loaders this package builds hide them, for
the Python API, the data report and the CLI alike.
"""

from __future__ import annotations

import warnings

__all__ = ["KNOWN_THIRD_PARTY_WARNINGS", "ignore_known_third_party_warnings"]

#: Message patterns (regular expressions matched at the start of the message) of the known warnings.
KNOWN_THIRD_PARTY_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)` is deprecated",  # lightning's pytree helper on torch >= 2.13
    r"'set_vital' is deprecated",  # torchdata's StatefulDataLoader on torch >= 2.13
)


def ignore_known_third_party_warnings() -> None:
    """Hide :data:`KNOWN_THIRD_PARTY_WARNINGS` from here on; every other warning is shown as before.

    Calling it again adds nothing: an identical filter replaces the earlier one.
    """
    for pattern in KNOWN_THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
