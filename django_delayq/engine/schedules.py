"""The marks of periodic tasks: per task, the latest occurrence enqueued (one HASH)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .jobhash import to_int

if TYPE_CHECKING:
    from .broker import Broker


def schedule_marks(broker: Broker, names: list[str]) -> list[int | None]:
    """Each task's latest occurrence enqueued (epoch ms), None where it has none."""
    if not names:
        return []
    with broker.connection_errors():
        marks = broker.client.hmget(broker.global_keys.schedules, names)
    return [to_int(mark, None) for mark in marks]


def advance_schedule(broker: Broker, task: str, occurrence_ms: int) -> None:
    """Raise ``task``'s mark to ``occurrence_ms`` (never lower it)."""
    with broker.connection_errors():
        broker.commands.advance_schedule(broker.global_keys.schedules, task, occurrence_ms)
