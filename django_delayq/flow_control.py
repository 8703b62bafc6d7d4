"""A task's per-key flow control: its concurrency key, limit, rate and weight, its dedupe
key and mode.

``@task(concurrency_key=..., concurrency_limit=N)`` and ``Task.using(concurrency_key=...,
dedupe_key=..., dedupe=..., dedupe_window=...)`` keep them in one :class:`FlowControl`;
a key may be a string or a callable of the task's arguments, called at each enqueue.
Everything is checked before anything is written (the engine's rules:
:mod:`django_delayq.engine.keyed`). See docs/flow-control.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .engine import keyed

#: A key given as a string, or as a callable of the task's arguments returning one.
KeySource = str | Callable[..., str]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FlowControl:
    concurrency_key: KeySource | None = None
    concurrency_limit: int | None = None
    dedupe_key: KeySource | None = None
    #: "exists" (default), "throttle", "debounce" or "keep_last".
    dedupe: str | None = None
    dedupe_window: float | dt.timedelta | None = None
    #: At most so many starts of a concurrency key per period: "10/m" (per key).
    key_rate_limit: str | None = None
    #: The key's share of the turns: weight 3 takes 3 turns for each 1 of a weight-1 key.
    key_weight: int | None = None

    def __post_init__(self) -> None:
        self._encode("k" if callable(self.concurrency_key) else self.concurrency_key,
                     "k" if callable(self.dedupe_key) else self.dedupe_key)

    def merged(self, **changes: Any) -> FlowControl | None:
        """A copy with the options of ``changes`` that are not None; None if it has none."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values.update({name: value for name, value in changes.items() if value is not None})
        if all(value is None for value in values.values()):
            return None
        return FlowControl(**values)

    def _encode(self, concurrency_key: Any, dedupe_key: Any) -> keyed.KeyedOptions | None:
        return keyed.encode(concurrency_key, self.concurrency_limit, dedupe_key,
                            self.dedupe, self.dedupe_window, self.key_rate_limit,
                            self.key_weight)

    def resolve(self, args: Sequence[Any], kwargs: Mapping[str, Any]
                ) -> tuple[keyed.KeyedOptions | None, str | None, float | None]:
        """For one job of these arguments: its keys as the engine takes them, the job id
        of ``dedupe="exists"`` (else None) and the delay of ``"debounce"`` (seconds, else
        None). Raises ``TypeError``/``ValueError`` for a key the callable got wrong."""
        ck, dk = self.concurrency_key, self.dedupe_key
        if callable(ck):
            ck = ck(*args, **kwargs)
        if callable(dk):
            dk = dk(*args, **kwargs)
        options = self._encode(ck, dk)
        job_id = None
        if dk is not None and self.dedupe in (None, "exists"):
            job_id = keyed.exists_job_id(dk)
        return options, job_id, keyed.debounce_delay(options)
