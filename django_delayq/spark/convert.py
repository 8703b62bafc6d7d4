"""Turning Spark row values into job arguments and run times, on the executors.

Nothing here imports Django or PySpark: the driver describes each column once as a
small picklable :data:`Spec` (see ``enqueue.spec_for``), and the executors
convert values with :func:`to_json_value`. A value that has no faithful JSON form
(binary, a map with non-string keys) raises :class:`Rejected` with the reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

#: How a column's values become JSON: ("plain",), ("timestamp",), ("binary",),
#: ("array", element), ("map", keys_are_strings, value), ("struct", ((name, spec), ...)).
Spec = tuple[Any, ...]

PLAIN: Spec = ("plain",)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class Rejected(Exception):
    """The row cannot become a job; the message says why."""


def to_json_value(value: Any, spec: Spec, where: str) -> Any:
    """``value`` as plain data the engine's JSON encoder accepts, or :class:`Rejected`.

    ``where`` names the argument in the reason. TimestampType values reach Python as
    naive datetimes in the executor's local time (PySpark's conversion); they become
    aware UTC datetimes here, so arguments keep the instant they had in Spark.
    """
    if value is None:
        return None
    kind = spec[0]
    if kind == "plain":
        return value
    if kind == "timestamp":
        # naive: the executor's local time, which astimezone() assumes for naive values
        return value.astimezone(dt.UTC)
    if kind == "binary":
        raise Rejected(f"{where} is binary ({len(value)} bytes), which has no JSON form: "
                       "encode it (base64, hex) in Spark first")
    if kind == "array":
        return [to_json_value(v, spec[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "map":
        if not spec[1] and value:
            key = next(iter(value), None)
            raise Rejected(f"{where} is a map with {type(key).__name__} keys; JSON object "
                           "keys are strings: cast the keys to string in Spark first")
        return {k: to_json_value(v, spec[2], f"{where}[{k!r}]") for k, v in value.items()}
    if kind == "struct":
        items = value.asDict() if hasattr(value, "asDict") else (
            value if isinstance(value, Mapping) else dict(zip((n for n, _ in spec[1]), value,
                                                              strict=False))
        )
        return {name: to_json_value(items.get(name), sub, f"{where}.{name}")
                for name, sub in spec[1]}
    raise Rejected(f"{where}: unsupported column kind {kind!r}")


def run_at_from_micros(value: Any) -> dt.datetime:
    """An epoch-microsecond value (Spark's ``unix_micros``) as an aware UTC datetime."""
    if value is None:
        raise Rejected("run_at is null")
    try:
        return EPOCH + dt.timedelta(microseconds=int(value))
    except (OverflowError, TypeError, ValueError):
        raise Rejected(f"run_at {str(value)[:40]!r} is out of range") from None


def run_at_from_text(value: Any) -> dt.datetime:
    """An ISO 8601 text with a UTC offset as an aware UTC datetime; naive is refused."""
    if value is None:
        raise Rejected("run_at is null")
    text = str(value).strip()
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Rejected(f"run_at {text!r} is not an ISO 8601 timestamp") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise Rejected(f"run_at {text!r} is naive (no UTC offset): write it with an offset, "
                       "e.g. 2030-01-01T09:00:00+00:00, or use a TIMESTAMP column")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise Rejected(f"run_at {text!r} is out of range") from None


def display(value: Any, limit: int = 200) -> Any:
    """``value`` in a form that shows what a rejected row held (JSON-friendly)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if hasattr(value, "asDict"):
        return {k: display(v, limit) for k, v in value.asDict().items()}
    if isinstance(value, Mapping):
        return {str(k): display(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [display(v, limit) for v in value]
    text = repr(bytes(value)) if isinstance(value, bytes | bytearray) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
