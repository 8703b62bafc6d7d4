"""JSON encoding of job arguments and results. JSON only: nothing is ever pickled."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import PayloadTooLarge


class JSONEncoder(json.JSONEncoder):
    """Encodes what Django's encoder does for job arguments: dates, times, decimals, UUIDs.

    The Django layer passes ``DjangoJSONEncoder`` instead; this one keeps the engine
    usable without Django (Spark executors, benchmarks).
    """

    def default(self, o: Any) -> Any:
        if isinstance(o, dt.datetime):
            text = o.isoformat()
            if o.microsecond:
                text = text[:23] + text[26:]
            if text.endswith("+00:00"):
                text = text.removesuffix("+00:00") + "Z"
            return text
        if isinstance(o, dt.date):
            return o.isoformat()
        if isinstance(o, dt.time):
            return o.isoformat()
        if isinstance(o, dt.timedelta):
            return o.total_seconds()
        if isinstance(o, decimal.Decimal | uuid.UUID):
            return str(o)
        return super().default(o)


_ENCODERS: dict[type[json.JSONEncoder], json.JSONEncoder] = {}


def _encoder(cls: type[json.JSONEncoder]) -> json.JSONEncoder:
    # One instance per class: encode() keeps no state between calls, so threads share it.
    encoder = _ENCODERS.get(cls)
    if encoder is None:
        encoder = _ENCODERS[cls] = cls(separators=(",", ":"), allow_nan=False)
    return encoder


def _dumps(value: Any, encoder: type[json.JSONEncoder]) -> str:
    return _encoder(encoder).encode(value)


def _refuse(task: str, label: str, value: Any, exc: Exception) -> TypeError:
    return TypeError(
        f"{task}: {label} ({type(value).__name__}) is not JSON serializable: {exc}. "
        "Pass plain data (str, int, float, bool, None, list, dict, date/time, Decimal, "
        "UUID), e.g. a model's primary key instead of the instance."
    )


def encode_arguments(
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    encoder: type[json.JSONEncoder] = JSONEncoder,
    names: Sequence[str] = (),
    limit: int = 0,
) -> tuple[str, str]:
    """Encode ``args`` and ``kwargs`` as JSON, naming the argument that cannot be encoded.

    ``names`` gives the parameter names of positional arguments, for the error message.
    ``limit`` (bytes, 0 for none) bounds the size of both encodings together.
    """
    try:
        # No arguments is common (and JSON "[]" whatever the encoder): skip the encoder.
        args_json = _dumps(list(args), encoder) if args else "[]"
        kwargs_json = _dumps(dict(kwargs), encoder) if kwargs else "{}"
    except (TypeError, ValueError, RecursionError) as exc:
        for i, value in enumerate(args):
            label = f"argument {names[i]!r} (position {i})" if i < len(names) else (
                f"positional argument {i}"
            )
            try:
                _dumps(value, encoder)
            except (TypeError, ValueError, RecursionError) as inner:
                raise _refuse(task, label, value, inner) from None
        for key, value in kwargs.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{task}: keyword argument names must be str, not {key!r}"
                ) from None
            try:
                _dumps(value, encoder)
            except (TypeError, ValueError, RecursionError) as inner:
                raise _refuse(task, f"argument {key!r}", value, inner) from None
        raise TypeError(f"{task}: arguments are not JSON serializable: {exc}") from None
    if limit and len(args_json) + len(kwargs_json) > limit:
        raise PayloadTooLarge(
            f"{task}: encoded arguments are {len(args_json) + len(kwargs_json)} bytes, over "
            f"the {limit}-byte limit (DELAYQ['MAX_PAYLOAD_BYTES']); store large data "
            "elsewhere and pass a reference"
        )
    return args_json, kwargs_json


def encode_result(value: Any, encoder: type[json.JSONEncoder] = JSONEncoder) -> str:
    """Encode a task's return value; raises ``TypeError`` when it is not JSON."""
    if value is None:  # most tasks return nothing: skip the encoder
        return "null"
    try:
        return _dumps(value, encoder)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(
            f"return value ({type(value).__name__}) is not JSON serializable: {exc}"
        ) from None


def decode(text: str | None) -> Any:
    """Decode a JSON text stored by the engine (``None`` stays ``None``)."""
    return None if text is None else json.loads(text)
