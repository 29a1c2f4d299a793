"""Validation of task arguments and results: plain JSON only, bounded in size and depth.

Arguments and results are stored in ``jsonb``. Anything that would not come back unchanged
from JSON, or that PostgreSQL would refuse, is refused before any SQL runs, with an error that
names the offending value, so a handler always receives exactly what was enqueued (no pickle,
no silent ``str()`` of a datetime) and a refused enqueue leaves the caller's transaction
usable. Refused are:

- types other than ``dict`` (with ``str`` keys), ``list``/``tuple``, ``str``, ``int``,
  ``float``, ``bool`` and ``None`` (subclasses too: an enum member would come back plain);
- a NUL character or a lone surrogate in any string, dict keys and keyword argument names
  included (see :func:`~django_pgtasks.definition.options.text_problem`);
- NaN and Infinity; floats of 1e16 and more, which ``jsonb`` gives back as integers;
  integers of more than :data:`MAX_INT_DIGITS` digits, which Python's JSON cannot read back;
- nesting deeper than ``PGTASKS["MAX_PAYLOAD_DEPTH"]``, and arguments larger than
  ``PGTASKS["MAX_PAYLOAD_BYTES"]`` (results: ``PGTASKS["MAX_RESULT_BYTES"]``) as JSON.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.options import text_problem
from django_pgtasks.exceptions import InvalidPayloadError

#: Where a value sits: a label ("Task argument args", or :data:`_KWARG` and the argument's
#: name) followed by the keys and indexes inside it.
Path = tuple[Any, ...]

#: The most digits of an integer: Python's default ``sys.get_int_max_str_digits()``, beyond
#: which ``json`` can neither write nor read the number back.
MAX_INT_DIGITS = 4300
_INT_BOUND = 10**MAX_INT_DIGITS
#: From this magnitude on a float's shortest repr has an exponent (``1e+16``); ``jsonb`` keeps
#: numbers as ``numeric`` and prints them without one, so it would come back as an ``int``.
_FLOAT_BOUND = 1e16

#: Path label of a keyword argument: the next item of the path is its name.
_KWARG = object()


def _unexpected(value: Any) -> Any:
    # The walk lets only JSON types through, so the encoder never asks for a conversion.
    raise TypeError(f"Unexpected {type(value).__name__} after validation.")


def _make_dumps() -> Callable[[Any], str]:
    """Compact, ASCII-only JSON text of an already validated value.

    The C encoder is built once: ``JSONEncoder.encode()`` builds one per call, which costs
    more than encoding a small payload. No circular-reference markers: the walk returns
    fresh lists and dicts, bounded in depth. Without the C accelerator (or should its
    private signature change), the documented encoder does the same, more slowly.
    """
    try:
        encoder = json.encoder.c_make_encoder(
            None, _unexpected, json.encoder.encode_basestring_ascii, None, ":", ",",
            False, False, False,
        )
    except TypeError:  # pragma: no cover
        return json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
    return lambda value: "".join(encoder(value, 0))


_dumps = _make_dumps()


def _describe(path: Path) -> str:
    label, *keys = path
    if label is _KWARG:
        label = f"Task argument {keys.pop(0)!r}"
    return str(label) + "".join(f"[{key!r}]" for key in keys)


def _check(value: Any, path: Path, depth: int, max_depth: int) -> Any:
    """Return ``value`` as JSON-native types (tuples become lists), or raise.

    The path is kept as a tuple and only turned into text for an error message: this runs
    for every value of every task, including the hundreds of thousands of a bulk enqueue.
    The common types are tested first, by identity; the slow checks run only for values
    that fail a cheap one.
    """
    kind = type(value)
    if kind is str:
        if value.isascii() and "\x00" not in value:
            return value
        problem = text_problem(value)
        if problem is not None:
            raise InvalidPayloadError(f"{_describe(path)} {problem}.")
        return value
    if kind is int:
        if -_INT_BOUND < value < _INT_BOUND:
            return value
        raise InvalidPayloadError(
            f"{_describe(path)} is an integer of more than {MAX_INT_DIGITS} digits, which "
            f"JSON cannot carry back to Python; pass it as a string instead."
        )
    if kind is bool or value is None:
        return value
    if kind is float:
        if -_FLOAT_BOUND < value < _FLOAT_BOUND:  # False for NaN and Infinity as well
            return value
        if not math.isfinite(value):
            raise InvalidPayloadError(
                f"{_describe(path)} is {value!r}; NaN and Infinity are not valid JSON."
            )
        raise InvalidPayloadError(
            f"{_describe(path)} is {value!r}, a float that PostgreSQL's jsonb gives back as "
            f"an integer; pass an int or a string instead."
        )
    is_mapping = kind is dict or (kind is not list and kind is not tuple
                                  and isinstance(value, Mapping))
    if is_mapping or kind is list or kind is tuple or (
        isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)
    ):
        if depth >= max_depth:
            raise InvalidPayloadError(
                f"{_describe(path)} is nested more than {max_depth} levels deep "
                f'(PGTASKS["MAX_PAYLOAD_DEPTH"]).'
            )
        if not is_mapping:
            return [_check(item, (*path, i), depth + 1, max_depth)
                    for i, item in enumerate(value)]
        out = {}
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or "\x00" in key:
                _check_key(key, path)
            out[key] = _check(item, (*path, key), depth + 1, max_depth)
        return out
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


def _check_key(key: Any, path: Path) -> None:
    """Refuse a dict key that is not a string PostgreSQL can store."""
    if type(key) is not str:
        raise InvalidPayloadError(
            f"{_describe(path)} has a dict key {key!r} of type "
            f"{type(key).__name__}; JSON object keys must be strings."
        )
    problem = text_problem(key)
    if problem is not None:
        raise InvalidPayloadError(f"{_describe((*path, key))} is a dict key that {problem}.")


def _check_name(name: Any) -> None:
    """Refuse a keyword argument name that is not a string PostgreSQL can store."""
    if type(name) is not str:
        raise InvalidPayloadError(
            f"Task argument name {name!r} is of type {type(name).__name__}; keyword "
            f"argument names must be strings."
        )
    problem = text_problem(name)
    if problem is not None:
        raise InvalidPayloadError(f"Task argument name {name!r} {problem}.")


def _encode(value: Any, what: str) -> str:
    try:
        return _dumps(value)
    except ValueError as exc:
        # Only when sys.set_int_max_str_digits() was lowered below MAX_INT_DIGITS.
        raise InvalidPayloadError(
            f"{what} cannot be written as JSON: an integer in it has more digits than "
            f"sys.get_int_max_str_digits() allows; pass it as a string instead."
        ) from exc


def normalize_value(value: Any, what: str) -> Any:
    """Validate one value as plain JSON that PostgreSQL stores unchanged; ``what`` names it
    in the error message. Raises :class:`~django_pgtasks.exceptions.InvalidPayloadError`."""
    return _check(value, (what,), 0, pgtasks_settings.MAX_PAYLOAD_DEPTH)


def normalize_result(value: Any, what: str = "The task's return value") -> Any:
    """Validate a handler's return value for storage as the task's result.

    :func:`normalize_value`, plus a bound: more than ``PGTASKS["MAX_RESULT_BYTES"]`` of JSON
    is refused. Raises :class:`~django_pgtasks.exceptions.InvalidPayloadError`; the callers
    turn it into :class:`~django_pgtasks.exceptions.UnstorableResultError`.
    """
    return result_json(value, what)[0]


def result_json(value: Any, what: str = "The task's return value") -> tuple[Any, str]:
    """:func:`normalize_result`, and the value's JSON text (compact, ASCII-only)."""
    clean = normalize_value(value, what)
    text = _encode(clean, what)
    size = len(text)  # ASCII-only JSON: characters are bytes
    limit = pgtasks_settings.MAX_RESULT_BYTES
    if size > limit:
        raise InvalidPayloadError(
            f"{what} takes {size} bytes as JSON, more than the limit of {limit} bytes "
            f'(PGTASKS["MAX_RESULT_BYTES"]); store large data elsewhere and return its id.'
        )
    return clean, text


def normalize_payload(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list, dict]:
    """Validate ``args``/``kwargs`` for storage and return them as JSON-native types.

    Raises :class:`~django_pgtasks.exceptions.InvalidPayloadError` naming the first offending
    argument when a value is not plain JSON that PostgreSQL stores unchanged (see the module
    docstring), is nested too deeply, or when the serialized payload exceeds
    ``PGTASKS["MAX_PAYLOAD_BYTES"]``.
    """
    clean_args, clean_kwargs, _, _ = serialize_payload(args, kwargs)
    return clean_args, clean_kwargs


def serialize_payload(
    args: Sequence[Any], kwargs: Mapping[str, Any], *,
    max_depth: int | None = None, max_bytes: int | None = None,
) -> tuple[list, dict, str, str]:
    """:func:`normalize_payload`, plus the two values serialized as JSON text.

    ``max_depth``/``max_bytes`` default to ``PGTASKS["MAX_PAYLOAD_DEPTH"]`` and
    ``PGTASKS["MAX_PAYLOAD_BYTES"]``; a caller serializing many payloads reads them once.
    """
    if max_depth is None:
        max_depth = pgtasks_settings.MAX_PAYLOAD_DEPTH
    # Many calls have no positional or no keyword arguments: their JSON is a constant.
    if args:
        clean_args = [_check(v, ("Task argument args", i), 1, max_depth)
                      for i, v in enumerate(args)]
        args_json = _encode(clean_args, "Task arguments")
    else:
        clean_args, args_json = [], "[]"
    if kwargs:
        clean_kwargs = {}
        for name, value in kwargs.items():
            if type(name) is not str or not name.isascii() or "\x00" in name:
                _check_name(name)
            clean_kwargs[name] = _check(value, (_KWARG, name), 1, max_depth)
        kwargs_json = _encode(clean_kwargs, "Task arguments")
    else:
        clean_kwargs, kwargs_json = {}, "{}"
    size = len(args_json) + len(kwargs_json)  # ASCII-only JSON: characters are bytes
    limit = pgtasks_settings.MAX_PAYLOAD_BYTES if max_bytes is None else max_bytes
    if size > limit:
        raise InvalidPayloadError(
            f"Task arguments take {size} bytes as JSON, more than the limit of {limit} bytes "
            f'(PGTASKS["MAX_PAYLOAD_BYTES"]); store large data elsewhere and pass its id.'
        )
    return clean_args, clean_kwargs, args_json, kwargs_json


def task_payload_json(task: Any) -> tuple[str, str]:
    """The JSON text of an unsaved task's ``args`` and ``kwargs``, validated.

    ``Task.objects.build()`` keeps the text it validated, so a bulk INSERT serializes each
    payload once. If ``args`` or ``kwargs`` were replaced since (the django.tasks backend sets
    them after building), they are validated again and the text is kept anew: nothing
    unchecked reaches the INSERT.
    """
    kept = task.__dict__.get("_payload_json")
    if kept is None or kept[0] is not task.args or kept[1] is not task.kwargs:
        kept = serialize_payload(task.args, task.kwargs)
        task.args, task.kwargs = kept[0], kept[1]
        task._payload_json = kept
    return kept[2], kept[3]
