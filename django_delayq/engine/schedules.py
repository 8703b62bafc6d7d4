"""The marks of periodic tasks: per task, the latest occurrence enqueued (one HASH); and
the schedules the workers run them on (another), which the admin reads: the web process
may not know a task a worker runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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


def register_schedules(broker: Broker, defs: Mapping[str, Mapping[str, Any]]) -> None:
    """Record the schedule of each periodic task ``defs`` names (task name -> its queue,
    cron, tz, every_ms and seen_ms: the Redis time of this record)."""
    if not defs:
        return
    with broker.connection_errors():
        broker.client.hset(broker.global_keys.schedule_defs,
                           mapping={name: json.dumps(dict(d)) for name, d in defs.items()})


def registered_schedules(broker: Broker) -> dict[str, dict[str, Any]]:
    """The schedules the workers recorded, by task name (an unreadable record skipped)."""
    with broker.read_errors():
        raw = broker.client.hgetall(broker.global_keys.schedule_defs)
    found = {}
    for name, text in raw.items():
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            found[name] = value
    return found
