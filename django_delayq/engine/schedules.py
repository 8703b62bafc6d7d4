"""The marks of periodic tasks: per task, the latest occurrence enqueued and the schedule
it was made under (one HASH); and the schedules the workers run them on (another), which
the admin reads: the web process may not know a task a worker runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .jobhash import to_int
from .keys import schedule_record

if TYPE_CHECKING:
    from .broker import Broker


@dataclass(frozen=True)
class Hold:
    """Which schedule a periodic task runs on, as :func:`hold_schedule` found it.

    ``state``: ``"same"`` (the caller's: plan after ``mark``), ``"switch"`` (the
    caller's schedule replaced ``spec``, whose mark was ``mark``: the mark is now the one
    the caller gave) or ``"held"`` (another schedule, ``spec``, replaced the caller's).
    """

    state: str
    mark: int | None = None
    spec: dict[str, Any] | None = None


def hold_schedule(broker: Broker, task: str, *, tag: str, spec: Mapping[str, Any],
                  since_ms: int, now_ms: int, stale_ms: int, switch_mark_ms: int) -> Hold:
    """Ask which schedule ``task`` runs on, for a scheduler of schedule ``tag`` (``spec``)
    started at ``since_ms``, and record the answer (``lua/hold_schedule.lua``)."""
    with broker.connection_errors():
        reply = broker.commands.hold_schedule(
            broker.global_keys.schedules, task, schedule_record(task), tag, since_ms,
            now_ms, stale_ms, json.dumps(dict(spec), sort_keys=True), switch_mark_ms)
    if reply[0] == "held":
        return Hold("held", spec=_spec(reply[1]))
    return Hold(reply[0], to_int(reply[1], None),
                _spec(reply[2]) if len(reply) > 2 else None)


def held_schedule(broker: Broker, task: str) -> dict[str, Any] | None:
    """The schedule ``task``'s record names (None: none, or unreadable)."""
    with broker.connection_errors():
        text = broker.client.hget(broker.global_keys.schedules, schedule_record(task))
    parts = str(text).split(" ", 3) if text is not None else []
    return _spec(parts[3]) if len(parts) == 4 else None


def advance_schedule(broker: Broker, task: str, occurrence_ms: int, *, tag: str) -> bool:
    """Raise ``task``'s mark to ``occurrence_ms`` (never lower it) while its record names
    the schedule ``tag``; False when another schedule replaced it."""
    with broker.connection_errors():
        return broker.commands.advance_schedule(
            broker.global_keys.schedules, task, occurrence_ms, schedule_record(task),
            tag) >= 0


def _spec(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


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
        value = _spec(text)
        if value is not None:
            found[name] = value
    return found
