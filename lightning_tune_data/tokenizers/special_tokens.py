"""Finding the ids of the special tokens (BOS, EOS, padding) in a tokenizer's vocabulary.

A token given by the user must exist; otherwise the tokenizer's own declaration is tried, then
common spellings. BOS and EOS are required; a missing pad token falls back to EOS, which is safe
because padding positions are always excluded from the loss and from attention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = [
    "DEFAULT_BOS_TOKENS",
    "DEFAULT_EOS_TOKENS",
    "DEFAULT_PAD_TOKENS",
    "resolve_special_id",
    "resolve_special_ids",
]

#: Token strings tried, in order, when no explicit special token is given (and, for
#: ``TransformersTokenizer``, the tokenizer declares no ``bos_token``/``eos_token``/``pad_token``).
DEFAULT_BOS_TOKENS: tuple[str, ...] = (
    "<s>",
    "<|begin_of_text|>",
    "<|startoftext|>",
    "<bos>",
    "[BOS]",
    "<|endoftext|>",  # GPT-2 style: one token serves as BOS and EOS
)
DEFAULT_EOS_TOKENS: tuple[str, ...] = (
    "</s>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<eos>",
    "[EOS]",
)
DEFAULT_PAD_TOKENS: tuple[str, ...] = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


def resolve_special_id(
    *,
    role: str,
    explicit: str | None,
    declared: str | None,
    defaults: Sequence[str],
    lookup: Callable[[str], int | None],
    owner: str,
) -> int | None:
    """Find the id of the ``role`` special token (``"bos"``, ``"eos"`` or ``"pad"``).

    Args:
        role: which special token this is; used in error messages and the argument name.
        explicit: token string the user passed (``bos_token=...``); it must exist or this raises.
        declared: token string the tokenizer itself declares (transformers' ``bos_token``), if any.
        defaults: common token strings tried in order when neither of the above is given.
        lookup: maps a token string to its id, or ``None`` when the vocabulary lacks it.
        owner: ``ClassName('path')`` for error messages.

    Returns:
        The id, or ``None`` when nothing was given and no default exists in the vocabulary.

    Raises:
        ValueError: an explicitly given token string is not in the vocabulary.
    """
    if explicit is not None:
        token_id = lookup(explicit)
        if token_id is None:
            raise ValueError(
                f"{owner}: {role}_token={explicit!r} is not in the tokenizer's vocabulary. "
                f"Pass a token string that exists, e.g. {role}_token='<token>' in Python or "
                f"`init_args: {{{role}_token: '<token>'}}` in YAML."
            )
        return token_id
    for candidate in ([declared] if declared else []) + list(defaults):
        token_id = lookup(candidate)
        if token_id is not None:
            return token_id
    return None


def _missing_special_error(role: str, tried: Sequence[str], owner: str) -> ValueError:
    """The error for a required special token (BOS/EOS) that could not be found."""
    return ValueError(
        f"{owner}: no {role.upper()} token found in the vocabulary (tried {list(tried)}). "
        f"Name the token that plays this role: {role}_token='<your {role} token>' in Python, or "
        f"`init_args: {{{role}_token: '<your {role} token>'}}` under the tokenizer in YAML."
    )


def resolve_special_ids(
    owner: str,
    lookup: Callable[[str], int | None],
    explicit: tuple[str | None, str | None, str | None],
    declared: tuple[str | None, str | None, str | None] = (None, None, None),
) -> tuple[int, int, int]:
    """The ``(bos_id, eos_id, pad_id)`` of a tokenizer, resolved in that order.

    Args:
        owner: ``ClassName('path')`` for error messages.
        lookup: maps a token string to its id, or ``None`` when the vocabulary lacks it.
        explicit: the ``(bos_token, eos_token, pad_token)`` the user passed (``None``: not given).
        declared: the ``(bos_token, eos_token, pad_token)`` the tokenizer itself declares.

    Raises:
        ValueError: a given token is not in the vocabulary, or no BOS or EOS token exists.
    """
    bos_id = resolve_special_id(
        role="bos", explicit=explicit[0], declared=declared[0], defaults=DEFAULT_BOS_TOKENS,
        lookup=lookup, owner=owner,
    )
    if bos_id is None:
        raise _missing_special_error("bos", DEFAULT_BOS_TOKENS, owner)
    eos_id = resolve_special_id(
        role="eos", explicit=explicit[1], declared=declared[1], defaults=DEFAULT_EOS_TOKENS,
        lookup=lookup, owner=owner,
    )
    if eos_id is None:
        raise _missing_special_error("eos", DEFAULT_EOS_TOKENS, owner)
    pad_id = resolve_special_id(
        role="pad", explicit=explicit[2], declared=declared[2], defaults=DEFAULT_PAD_TOKENS,
        lookup=lookup, owner=owner,
    )
    return int(bos_id), int(eos_id), int(eos_id if pad_id is None else pad_id)
