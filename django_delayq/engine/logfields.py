"""How the package writes a log record: one place, so every record reads the same way.

A record is an event (``job completed``) followed by ``key=value`` pairs, and carries the
same fields as ``extra``, so a JSON formatter (docs/logging.md) sees ``job``, ``task``,
``queue``, ``attempt``, ``outcome``, ``duration_ms``, ``worker``... as fields of their
own, not only as text.

A value is written as it is when it is a plain word; otherwise (a space, a quote, an
``=``, a backslash, a control or line-separating character, or nothing at all) it is
quoted as a JSON string. An error message holding a newline and ``queue=fake job=other``
therefore stays inside one quoted value of one line: it can start neither a record nor
a key of its own.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final

#: A value written without quotes: printable ASCII with no space, quote, ``=`` or ``\``.
_PLAIN: Final = re.compile(r"[!#-<>-\[\]-~]+")
#: Characters some readers take as the end of a line, which JSON leaves as they are.
_BREAKS: Final = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029",
                  "\x7f": "\\u007f"}

#: What a LogRecord holds of its own: a field of that name is given as ``delayq_<name>``
#: in ``extra`` (logging refuses to overwrite them).
RESERVED: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
#: The names reserved by each record factory met: a project's factory (set with
#: ``logging.setLogRecordFactory``, after this module loaded) may add its own, say
#: ``host``, which a field of that name would otherwise collide with (a KeyError).
_RESERVED_BY_FACTORY: dict[Any, frozenset[str]] = {logging.getLogRecordFactory(): RESERVED}


def reserved() -> frozenset[str]:
    """The attribute names a record of the current record factory holds of its own."""
    factory = logging.getLogRecordFactory()
    names = _RESERVED_BY_FACTORY.get(factory)
    if names is None:
        names = RESERVED | frozenset(vars(logging.makeLogRecord({})))
        if len(_RESERVED_BY_FACTORY) < 16:  # factories are set once, not per record
            _RESERVED_BY_FACTORY[factory] = names
    return names

ExcInfo = (BaseException | tuple[type[BaseException], BaseException, TracebackType | None]
           | bool | None)


def quote(value: Any) -> str:
    """``value`` as it is written after ``key=``: bare when it is a plain word, else a
    JSON string on one line."""
    text = value if isinstance(value, str) else str(value)
    if _PLAIN.fullmatch(text):
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    for char, escape in _BREAKS.items():
        if char in quoted:
            quoted = quoted.replace(char, escape)
    return quoted


class Pairs:
    """The ``key=value`` text of a record's fields, built only when a handler formats
    the record. ``attempt`` with ``max_attempts`` reads ``attempt=2/5``."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        fields = self.fields
        parts = []
        for key, value in fields.items():
            if value is None or key == "max_attempts":
                continue
            if key == "attempt" and "max_attempts" in fields:
                parts.append(f"attempt={quote(value)}/{quote(fields['max_attempts'])}")
            else:
                parts.append(f"{key}={quote(value)}")
        return " ".join(parts)


def log(logger: logging.Logger, level: int, event: str, /, *, exc_info: ExcInfo = None,
        **fields: Any) -> None:
    """Write ``event`` with ``fields`` to ``logger`` at ``level``: as text (``event
    key=value ...``) and as the record's ``extra``. A field whose value is None is left
    out of the text (and is None on the record)."""
    if logger.isEnabledFor(level):
        taken = reserved()
        extra = fields if taken.isdisjoint(fields) else {
            f"delayq_{key}" if key in taken else key: value
            for key, value in fields.items()}
        if fields:
            logger.log(level, "%s %s", event, Pairs(fields), extra=extra,
                       exc_info=exc_info, stacklevel=2)
        else:  # the event alone, with no space after it
            logger.log(level, "%s", event, exc_info=exc_info, stacklevel=2)


