"""Option checks driven by annotations: one rule for every frozen options dataclass, strict
(``True`` is not an int, ``2.0`` is not an int, ``"224"`` is not a tuple)."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin


def conforms(value: object, hint: Any) -> bool:
    """Whether ``value`` has the annotated type ``hint`` (unknown hints accept anything)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if origin is Union or origin is types.UnionType:
        return any(conforms(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(conforms(v, a) for v, a in zip(value, args, strict=True))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an int is a fine float (scale=(1, 1)); a bool is not
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type) and origin is None:  # Python 3.10 calls dict[str, Any] a type
        return isinstance(value, hint)
    return True


def describe(hint: Any) -> str:
    """What ``hint`` accepts, in words: ``'pad' or 'drop'``, ``True or False``, ``an int``."""
    words = _words(hint)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _words(hint: Any) -> list[str]:
    """The values ``hint`` accepts, spelled one by one where they are few."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is None or hint is type(None):
        return ["None"]
    if origin is Literal:
        return [repr(a) for a in args]
    if origin is Union or origin is types.UnionType:
        return [w for a in args for w in _words(a)]
    if hint is bool:
        return ["True", "False"]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return [f"a tuple of {_plain(args[0])}"]
        return ["a (" + ", ".join(_plain(a) for a in args) + ") tuple"]
    return [f"{'an' if _plain(hint)[0] in 'aeiou' else 'a'} {_plain(hint)}"]


def _plain(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)
