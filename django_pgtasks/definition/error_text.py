"""The error texts stored on a task: ``Type: message``, a blank line and the traceback.

:func:`error_text` turns any exception into that text, made storable (PostgreSQL's ``text``
holds neither NUL nor a lone surrogate, which a file name decoded with ``surrogateescape``
carries) and bounded by ``PGTASKS["ERROR_TEXT_LIMIT"]``.
"""

from __future__ import annotations

import traceback

from django_pgtasks.conf import pgtasks_settings


def qualified_name(cls: type) -> str:
    """``module.QualName`` of an exception class, as stored at the head of an error text."""
    return f"{cls.__module__}.{cls.__qualname__}"


def storable(text: str) -> str:
    """``text`` with what PostgreSQL cannot store spelled out: NUL as ``\\x00``, lone
    surrogates as ``\\udcxx``."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def truncate_error(text: str) -> str:
    """Bound ``text`` to ``PGTASKS["ERROR_TEXT_LIMIT"]`` characters, keeping head and tail,
    after making it storable (:func:`storable`).

    The head holds the exception type and message, the tail the innermost frames; the middle
    of a long traceback is replaced by a marker saying how much was cut.
    """
    limit = pgtasks_settings.ERROR_TEXT_LIMIT
    text = storable(text)
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters cut ...]\n"
    if limit <= len(marker.format(len(text))):  # no room for the marker: the head alone
        return text[:limit]
    keep = limit - len(marker.format(len(text)))
    head = keep // 3
    tail = keep - head
    return text[:head] + marker.format(len(text) - keep) + (text[-tail:] if tail else "")


def format_exception(exc: BaseException) -> str:
    """``Type: message``, a blank line, then the traceback (not yet made storable).

    The type and message come first so they survive truncation and group well; an exception
    whose ``__str__`` fails is still recorded (the traceback module substitutes a marker).
    """
    try:
        header = "".join(traceback.format_exception_only(exc)).strip()
        return f"{header}\n\n{''.join(traceback.format_exception(exc))}"
    except Exception:
        return f"{qualified_name(type(exc))}: <unprintable exception>"


def error_text(exc: BaseException) -> str:
    """The text stored for ``exc``: formatted, storable and bounded."""
    return truncate_error(format_exception(exc))


def reason_text(exc_class: type[BaseException], message: str) -> str:
    """The text stored for an outcome the worker decides on its own (no traceback):
    ``module.Class: message``, storable and bounded."""
    return truncate_error(f"{qualified_name(exc_class)}: {message}")
