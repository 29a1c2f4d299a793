"""Validation of task arguments: plain JSON only, bounded in size and depth.

Arguments are stored in ``jsonb``. Anything that would not come back unchanged from JSON is
refused at enqueue time with an error that names the offending argument, so a handler always
receives exactly what was enqueued (no pickle, no silent ``str()`` of a datetime).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .conf import pgtasks_settings
from .exceptions import InvalidPayloadError

#: Where a value sits: a label ("Task argument 'user'") followed by keys/indexes inside it.
Path = tuple[Any, ...]

_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def _describe(path: Path) -> str:
    label, *keys = path
    return str(label) + "".join(f"[{key!r}]" for key in keys)


def _check(value: Any, path: Path, depth: int, max_depth: int) -> Any:
    """Return ``value`` as JSON-native types (tuples become lists), or raise.

    The path is kept as a tuple and only turned into text for an error message: this runs
    for every value of every task, including the hundreds of thousands of a bulk enqueue.
    """
    kind = type(value)
    if kind is int or kind is bool or value is None:
        return value
    if kind is str:
        if "\x00" in value:
            raise InvalidPayloadError(
                f"{_describe(path)} contains a NUL character, which PostgreSQL cannot store."
            )
        return value
    if kind is float:
        if not math.isfinite(value):
            raise InvalidPayloadError(
                f"{_describe(path)} is {value!r}; NaN and Infinity are not valid JSON."
            )
        return value
    if depth >= max_depth and isinstance(value, Mapping | Sequence) and kind not in (
        bytes, bytearray,
    ):
        raise InvalidPayloadError(
            f"{_describe(path)} is nested more than {max_depth} levels deep "
            f'(PGTASKS["MAX_PAYLOAD_DEPTH"]).'
        )
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidPayloadError(
                    f"{_describe(path)} has a dict key {key!r} of type "
                    f"{type(key).__name__}; JSON object keys must be strings."
                )
            out[key] = _check(item, (*path, key), depth + 1, max_depth)
        return out
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return [_check(item, (*path, i), depth + 1, max_depth) for i, item in enumerate(value)]
    if isinstance(value, str | int | float):  # a subclass, e.g. an enum member
        base = next(b.__name__ for b in (str, int, float) if isinstance(value, b))
        raise InvalidPayloadError(
            f"{_describe(path)} of type {kind.__name__} would come back from JSON as a plain "
            f"{base}; pass {base}({_describe(path).split()[-1]}) instead."
        )
    raise InvalidPayloadError(
        f"{_describe(path)} of type {kind.__name__} is not JSON-serializable; "
        f"pass plain data (for example an id or an ISO 8601 string) instead."
    )


def normalize_value(value: Any, what: str) -> Any:
    """Validate one value (e.g. a task's return value) as plain JSON; ``what`` names it."""
    return _check(value, (what,), 0, pgtasks_settings.MAX_PAYLOAD_DEPTH)


def normalize_payload(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list, dict]:
    """Validate ``args``/``kwargs`` for storage and return them as JSON-native types.

    Raises :class:`~django_pgtasks.exceptions.InvalidPayloadError` naming the first offending
    argument when a value is not plain JSON, is NaN/Infinity, is nested too deeply, or when the
    serialized payload exceeds ``PGTASKS["MAX_PAYLOAD_BYTES"]``.
    """
    clean_args, clean_kwargs, _, _ = serialize_payload(args, kwargs)
    return clean_args, clean_kwargs


def serialize_payload(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list, dict, str, str]:
    """:func:`normalize_payload`, plus the two values serialized as JSON text."""
    max_depth = pgtasks_settings.MAX_PAYLOAD_DEPTH
    clean_args = [_check(v, ("Task argument args", i), 1, max_depth)
                  for i, v in enumerate(args)]
    clean_kwargs = {
        name: _check(value, (f"Task argument {name!r}",), 1, max_depth)
        for name, value in kwargs.items()
    }
    args_json, kwargs_json = _dumps(clean_args), _dumps(clean_kwargs)
    size = len(args_json) + len(kwargs_json)  # ASCII-only JSON: characters are bytes
    limit = pgtasks_settings.MAX_PAYLOAD_BYTES
    if size > limit:
        raise InvalidPayloadError(
            f"Task arguments take {size} bytes as JSON, more than the limit of {limit} bytes "
            f'(PGTASKS["MAX_PAYLOAD_BYTES"]); store large data elsewhere and pass its id.'
        )
    return clean_args, clean_kwargs, args_json, kwargs_json
