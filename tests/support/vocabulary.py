"""The words of the ``Literal`` vocabularies in gateway/wire.py."""

from __future__ import annotations

from typing import get_args


def words(vocabulary: object) -> set[str]:
    """The words of a vocabulary: a ``Literal``, or a union of them."""
    args = get_args(vocabulary)
    if all(isinstance(a, str) for a in args):
        return set(args)
    return set().union(*(words(a) for a in args))
