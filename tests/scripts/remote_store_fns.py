"""A preprocess function the remote-store tests refer to by dotted path (``remote_store_fns.<name>``).

The tests put ``tests/scripts`` on ``sys.path`` (and on ``PYTHONPATH`` of the processes they
start), so every process imports the same module and computes the same store fingerprint.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from lightning_tune_data.preprocess import tokenize_text

#: When set, the process preprocessing a row whose text starts with this value kills itself
#: (SIGKILL: no cleanup, no ``finally``), as a preempted or OOM-killed task would die.
KILL_AT = "REMOTE_STORE_KILL_AT"


def tokenize_or_die(examples: dict[str, list], tokenizer: Any) -> dict[str, list]:
    """``tokenize_text``, except that it SIGKILLs its own process at the row named by ``$REMOTE_STORE_KILL_AT``."""
    marker = os.environ.get(KILL_AT)
    if marker and any(text.startswith(marker) for text in examples["text"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return tokenize_text(examples, tokenizer)
