"""The one JSON codec of job arguments and results. JSON only: nothing is ever pickled.

Every producer (``@task``, ``enqueue_many``, the outbox, the Django Tasks backend, Spark
executors, the engine used bare) and every worker encodes through this module, so one job
stores the same bytes whoever enqueued it. Values JSON has no type for are written as
Django's ``DjangoJSONEncoder`` writes them, byte for byte, without importing Django:

- ``datetime``: ISO 8601 cut to milliseconds (ECMAScript's date format), ``Z`` for UTC;
  a naive one stays naive (no offset);
- ``date``, and a naive ``time`` (cut to milliseconds); an aware ``time`` is refused: an
  offset without a date is ambiguous across daylight saving;
- ``timedelta``: an ISO 8601 duration, ``P1DT02H03M04.000005S``;
- ``Decimal`` and ``UUID``: their text;
- whatever :func:`register` adds: the Django layer registers its lazy strings there.

Anything else raises ``TypeError`` naming the argument, before anything is written.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import PayloadTooLarge, ResultTooLarge

#: Types added by :func:`register`, with how each is written.
_REGISTERED: dict[type, Callable[[Any], Any]] = {}
#: Types written as their text (a tuple: ``A | B`` would build a union at every call).
_AS_TEXT = (decimal.Decimal, uuid.UUID)
#: What a value the encoder refuses raises inside ``json``.
_REFUSED = (TypeError, ValueError, RecursionError)


def register(kind: type, convert: Callable[[Any], Any]) -> None:
    """Encode instances of ``kind`` as ``convert(value)`` (a JSON-able value) from now on.

    For types the engine cannot import: ``django_delayq.connection``, which builds every
    broker of the Django layer, registers ``Promise`` (lazy translations) as it is
    imported. Registering is not thread-safe: do it at import time.
    """
    _REGISTERED[kind] = convert


def iso_duration(delta: dt.timedelta) -> str:
    """``delta`` as an ISO 8601 duration: days, hours, minutes, seconds, and microseconds
    (six digits) when there are any: ``P1DT02H03M04.000005S``, ``-P0DT00H00M01.500000S``."""
    sign = "-" if delta < dt.timedelta(0) else ""
    delta = abs(delta)  # days >= 0 from here: -1 day + 3 s is -P0DT23H59M57S
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    fraction = f".{delta.microseconds:06d}" if delta.microseconds else ""
    return f"{sign}P{delta.days}DT{hours:02d}H{minutes:02d}M{seconds:02d}{fraction}S"


class JSONEncoder(json.JSONEncoder):
    """Writes what plain JSON cannot hold as the module docstring says."""

    def default(self, o: Any) -> Any:
        if isinstance(o, dt.datetime):  # before date: a datetime is a date
            text = o.isoformat()
            if o.microsecond:  # "...:05.123456+01:00" -> "...:05.123+01:00"
                text = text[:23] + text[26:]
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        if isinstance(o, dt.date):
            return o.isoformat()
        if isinstance(o, dt.time):
            if o.utcoffset() is not None:
                raise ValueError("an aware time has no JSON form (its offset depends on "
                                 "the date): pass a naive time, or an aware datetime")
            return o.isoformat()[:12] if o.microsecond else o.isoformat()
        if isinstance(o, dt.timedelta):
            return iso_duration(o)
        if isinstance(o, _AS_TEXT):
            return str(o)
        for kind, convert in _REGISTERED.items():
            if isinstance(o, kind):
                return convert(o)
        return super().default(o)


# encode() keeps no state between calls: one instance serves every thread.
_ENCODER = JSONEncoder(separators=(",", ":"), allow_nan=False)
dumps = _ENCODER.encode


def _refuse(task: str, label: str, value: Any, exc: Exception) -> TypeError:
    return TypeError(
        f"{task}: {label} ({type(value).__name__}) is not JSON serializable: {exc}. "
        "Pass plain data (str, int, float, bool, None, list, dict, date/time, timedelta, "
        "Decimal, UUID), e.g. a model's primary key instead of the instance."
    )


def encode_arguments(
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    names: Sequence[str] = (),
    limit: int = 0,
) -> tuple[str, str]:
    """Encode ``args`` and ``kwargs`` as JSON, naming the argument that cannot be encoded.

    ``names`` gives the parameter names of positional arguments, for the error message.
    ``limit`` (bytes, 0 for none) bounds the size of both encodings together.
    """
    try:
        # No arguments is common (and JSON "[]" whatever the values): skip the encoder.
        args_json = dumps(list(args)) if args else "[]"
        kwargs_json = dumps(dict(kwargs)) if kwargs else "{}"
    except _REFUSED as exc:
        for i, value in enumerate(args):
            label = f"argument {names[i]!r} (position {i})" if i < len(names) else (
                f"positional argument {i}"
            )
            try:
                dumps(value)
            except _REFUSED as inner:
                raise _refuse(task, label, value, inner) from None
        for key, value in kwargs.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{task}: keyword argument names must be str, not {key!r}"
                ) from None
            try:
                dumps(value)
            except _REFUSED as inner:
                raise _refuse(task, f"argument {key!r}", value, inner) from None
        raise TypeError(f"{task}: arguments are not JSON serializable: {exc}") from None
    if limit and len(args_json) + len(kwargs_json) > limit:
        raise PayloadTooLarge(
            f"{task}: encoded arguments are {len(args_json) + len(kwargs_json)} bytes, over "
            f"the {limit}-byte limit (DELAYQ['MAX_PAYLOAD_BYTES']); store large data "
            "elsewhere and pass a reference"
        )
    return args_json, kwargs_json


def encode_result(value: Any, *, limit: int = 0) -> str:
    """Encode a task's return value; raises ``TypeError`` when it is not JSON, and
    :class:`ResultTooLarge` when its JSON is over ``limit`` bytes (0: no limit)."""
    if value is None:  # most tasks return nothing: skip the encoder
        return "null"
    try:
        text = dumps(value)
    except _REFUSED as exc:
        raise TypeError(
            f"return value ({type(value).__name__}) is not JSON serializable: {exc}"
        ) from None
    if limit and len(text) > limit:  # ASCII (ensure_ascii): one byte a character
        raise ResultTooLarge(
            f"the return value ({type(value).__name__}) is {len(text)} bytes of JSON, over "
            f"the {limit}-byte limit (DELAYQ['RESULT_MAX_BYTES']); store large results "
            "elsewhere and return a reference")
    return text


def cut_utf8(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (its end kept with ``keep_end``),
    never in the middle of a character."""
    if len(text) * 4 <= limit:  # (the usual case: no encoding needed)
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    cut = data[len(data) - limit:] if keep_end else data[:limit]
    return cut.decode("utf-8", "ignore")


def decode(text: str | None) -> Any:
    """Decode a JSON text stored by the engine (``None`` stays ``None``)."""
    return None if text is None else json.loads(text)
