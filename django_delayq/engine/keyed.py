"""Per-key flow control: concurrency keys, fair turns between keys, dedupe keys.

A job may carry a **concurrency key** with a limit: at most that many jobs of the key
are leased at once in its queue (every worker, process and shard: a keyed job is stored
in the shard its key picks, so one key's jobs share one Cluster slot). The claim script
parks a job whose key is at its limit and goes on with the next one; the script that
takes a job of the key out of the active set (complete, fail, release, reclaim) frees
its slot and makes the key's oldest parked job ready again (``lua/includes/keyed_ctx.lua``).
Keyed jobs of one priority are claimed in **fair turns**, round robin between keys and
FIFO within one.

A **dedupe key** with a mode decides whether an enqueue adds a job at all:

- ``"exists"``: no second job while the first exists (the key becomes the job id);
- ``"throttle"``: at most one job per ``window``; the others are ignored;
- ``"debounce"``: the job starts ``window`` after the last enqueue; each enqueue while
  it waits replaces its arguments and pushes its start;
- ``"keep_last"``: while a job waits (scheduled or ready), a new enqueue replaces its
  arguments; once it runs, the next enqueue adds a job (one running, one waiting: with
  the key as its concurrency key, limit 1, unless another is given).

What the enqueue did is :class:`Outcome`: created, replaced, ignored or duplicate.
See docs/flow-control.md.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from . import validation
from .limits import parse_rate

if TYPE_CHECKING:
    from .core import BrokerCore
    from .keys import QueueKeys

#: The longest concurrency or dedupe key (characters).
MAX_KEY_LENGTH = 200
#: The highest concurrency limit.
MAX_LIMIT = 100_000
#: The highest weight of a key's turns; also the FIFO numbers one turn spans (``TURN``
#: in lua/includes/turn.lua), so a job of weight w moves its key 16/w numbers on.
MAX_WEIGHT = 16
DEDUPE_MODES = ("exists", "throttle", "debounce", "keep_last")


class Outcome(StrEnum):
    """What one enqueue did (the ``added`` value of the enqueue script's reply)."""

    DUPLICATE = "duplicate"  # a job with that id exists: nothing added
    CREATED = "created"
    REPLACED = "replaced"  # the waiting job of the dedupe key took these arguments
    IGNORED = "ignored"  # throttled: the dedupe key's window is not over


OUTCOMES = {0: Outcome.DUPLICATE, 1: Outcome.CREATED, 2: Outcome.REPLACED, 3: Outcome.IGNORED}


class KeyedOptions(NamedTuple):
    """A job's keys as the enqueue script takes them (its 8 keyed values after the index)."""

    concurrency_key: str = ""
    concurrency_limit: int = 0
    dedupe_key: str = ""
    #: '' (none: "exists" becomes the job id), 'throttle', 'debounce' or 'keep_last'.
    dedupe_mode: str = ""
    window_ms: int = 0
    #: Per-key start rate: at most ``rate_limit`` starts of the key per ``rate_period_ms``.
    rate_limit: int = 0
    rate_period_ms: int = 0
    #: The key's jobs take this many turns for each turn of a key of weight 1.
    weight: int = 1


def check_key(key: Any, what: str) -> str:
    """Return ``key`` if it is a usable concurrency or dedupe key, else raise."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a string (or a callable returning one), "
                        f"not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise ValueError(f"invalid {what} {key[:80]!r}: use 1-{MAX_KEY_LENGTH} printable "
                         "characters")
    return key


def check_limit(limit: Any) -> int:
    """Return ``limit`` if it is an int from 1 to :data:`MAX_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"concurrency_limit must be an int from 1 to {MAX_LIMIT}, "
                         f"not {limit!r}")
    return limit


def check_weight(weight: Any) -> int:
    """Return ``weight`` if it is an int from 1 to :data:`MAX_WEIGHT`."""
    if isinstance(weight, bool) or not isinstance(weight, int) or \
            not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"key_weight must be an int from 1 to {MAX_WEIGHT}, not {weight!r}")
    return weight


def check_mode(mode: Any) -> str:
    if mode not in DEDUPE_MODES:
        raise ValueError(f"dedupe must be one of {', '.join(DEDUPE_MODES)}, not {mode!r}")
    return str(mode)


def encode(concurrency_key: str | None, concurrency_limit: int | None,
           dedupe_key: str | None, dedupe: str | None, window: Any,
           key_rate_limit: str | None = None, key_weight: int | None = None,
           ) -> KeyedOptions | None:
    """Check a job's flow-control options and return them as the script takes them
    (None when the job has none). ``dedupe="exists"`` is not here: it is the job id.
    ``key_rate_limit`` ("10/m", as a queue's ``rate_limit``) limits the starts of the
    concurrency key and ``key_weight`` weighs its turns; with either and no
    ``concurrency_limit``, the key's concurrency is not limited."""
    per_key = (concurrency_limit, key_rate_limit, key_weight)
    if concurrency_key is None and dedupe_key is None:
        if any(value is not None for value in (*per_key, dedupe, window)):
            raise ValueError("concurrency_limit, key_rate_limit and key_weight need a "
                             "concurrency_key, and dedupe or dedupe_window a dedupe_key")
        return None
    ck = "" if concurrency_key is None else check_key(concurrency_key, "concurrency_key")
    limit, rate, weight = 0, None, 1
    if ck:
        if key_rate_limit is not None:
            rate = parse_rate(key_rate_limit)
        if key_weight is not None:
            weight = check_weight(key_weight)
        default = 1 if rate is None and key_weight is None else MAX_LIMIT
        limit = check_limit(default if concurrency_limit is None else concurrency_limit)
    elif any(value is not None for value in per_key):
        raise ValueError("concurrency_limit, key_rate_limit and key_weight need a "
                         "concurrency_key")
    dk, mode, window_ms = "", "", 0
    if dedupe_key is not None:
        dk = check_key(dedupe_key, "dedupe_key")
        mode = check_mode("exists" if dedupe is None else dedupe)
        if mode == "exists":
            if window is not None:
                raise ValueError('dedupe="exists" takes no dedupe_window')
            mode = ""
        else:
            if window is None and mode != "keep_last":
                raise ValueError(f'dedupe="{mode}" needs a dedupe_window (seconds or a '
                                 "timedelta)")
            window_ms = 0 if window is None else validation.delay_ms(window)
            if mode == "keep_last" and not ck:
                ck, limit = dk, 1
    elif dedupe is not None or window is not None:
        raise ValueError("dedupe and dedupe_window need a dedupe_key")
    if not ck and not mode:
        return None
    return KeyedOptions(ck, limit, dk, mode, window_ms, *(
        (rate.limit, rate.period_ms) if rate is not None else (0, 0)), weight)


def debounce_delay(options: KeyedOptions | None) -> float | None:
    """Seconds a debounced job waits from the enqueue that reaches Redis (its window),
    else None. Every path that sends such a job sets its due time from this."""
    if options is None or options.dedupe_mode != "debounce":
        return None
    return options.window_ms / 1000


def to_text(options: KeyedOptions | None) -> str:
    """``options`` as text to store (an outbox row): a JSON list of its values, '' for
    none. :func:`from_text` reads it back."""
    return "" if options is None else json.dumps(list(options), ensure_ascii=False)


def from_text(text: str) -> KeyedOptions | None:
    """The options :func:`to_text` wrote, checked again: a damaged value raises
    ``ValueError`` (or ``TypeError``) rather than reach the enqueue script."""
    if not text:
        return None
    values = json.loads(text)
    fields = KeyedOptions._fields
    if not isinstance(values, list) or len(values) != len(fields):
        raise ValueError(f"stored flow-control keys are not a list of {len(fields)} values")
    options = KeyedOptions(*values)
    for name, value in zip(fields, options, strict=True):
        wanted = str if name in ("concurrency_key", "dedupe_key", "dedupe_mode") else int
        if type(value) is not wanted or (isinstance(value, int) and value < 0):
            raise ValueError(f"stored flow-control keys: bad {name} {value!r}")
    if options.concurrency_key:
        check_key(options.concurrency_key, "concurrency_key")
        check_limit(options.concurrency_limit)
        check_weight(options.weight)
    if options.dedupe_key:
        check_key(options.dedupe_key, "dedupe_key")
    if options.dedupe_mode and (check_mode(options.dedupe_mode) == "exists"
                                or not options.dedupe_key):
        raise ValueError(f"stored flow-control keys: bad dedupe {options.dedupe_mode!r}")
    if not options.concurrency_key and not options.dedupe_mode:
        raise ValueError("stored flow-control keys name no key")
    return options


def exists_job_id(dedupe_key: str) -> str:
    """The job id of ``dedupe="exists"``: the key itself, checked as a job id."""
    return validation.validate_new_job_id(dedupe_key)


def shard_key(options: KeyedOptions) -> str:
    """What picks a keyed job's shard: its concurrency key (its slots and turns live in
    one shard), else its dedupe key (its record does)."""
    return options.concurrency_key or options.dedupe_key


def id_in_shard(key: str, shards: int, ids: Iterator[str]) -> str:
    """A new job id from ``ids`` that lands in the shard of ``key`` among ``shards``
    (the shard of a job is chosen from its id: ``BrokerCore.keys_for``)."""
    if shards <= 1:
        return next(ids)
    want = zlib.crc32(key.encode()) % shards
    for job_id in ids:  # about `shards` tries
        if zlib.crc32(job_id.encode()) % shards == want:
            return job_id
    raise AssertionError("the id source ended")  # pragma: no cover


def keyed_values(index: int, options: KeyedOptions) -> list[Any]:
    """The 9 ARGV values of one keyed job of an enqueue call (``index`` 1-based)."""
    return [index, *options]


#: The member of a shard's ``key_waiting`` ZSET that holds its total (no key is empty).
TOTAL = ""


@dataclass(slots=True)
class KeyLoad:
    """The busiest concurrency keys of a queue: jobs holding a slot, jobs waiting for
    one (``top`` keys each, most first), and the jobs waiting for a slot in all."""

    active: list[tuple[str, int]] = field(default_factory=list)
    waiting: list[tuple[str, int]] = field(default_factory=list)
    waiting_total: int = 0


def key_load(broker: BrokerCore, queue: str, top: int = 10) -> KeyLoad:
    """Read the :class:`KeyLoad` of ``queue`` over its shards (one round trip)."""
    return key_loads(broker, [queue], top)[0]


def key_loads(broker: BrokerCore, queues: list[str], top: int = 10) -> list[KeyLoad]:
    """The :class:`KeyLoad` of each of ``queues``, in their order, in one round trip
    whatever their number (a scrape of every queue)."""
    with broker.read_errors():
        pipe = broker.client.pipeline(transaction=False)
        for queue in queues:
            for keys in broker.shards(queue):
                pipe.zrevrange(keys.key_active, 0, top - 1, withscores=True)
                pipe.zrevrange(keys.key_waiting, 0, top, withscores=True)
        replies = pipe.execute() if queues else []
    loads, at = [], 0
    for queue in queues:
        shards = 2 * broker.shard_count(queue)
        loads.append(_load(replies[at:at + shards], top))
        at += shards
    return loads


def _load(replies: list[Any], top: int) -> KeyLoad:
    active: dict[str, int] = {}
    waiting: dict[str, int] = {}
    total = 0
    for i, reply in enumerate(replies):
        for key, score in reply:
            if i % 2 == 0:
                active[key] = active.get(key, 0) + int(score)
            elif key == TOTAL:
                total += int(score)
            else:
                waiting[key] = waiting.get(key, 0) + int(score)

    def busiest(counts: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]

    return KeyLoad(busiest(active), busiest(waiting), total)


def purge_parked(broker: BrokerCore, keys: QueueKeys) -> int:
    """Delete the jobs of the shard ``keys`` parked for a slot of their key (ready jobs
    outside the ready set), as ``Queue.purge`` deletes ready ones; how many went. The
    keys' turns go too: no ready job is left to take its turn after them (a key's next
    job starts its turns afresh), and a turn kept for each key would never go."""
    removed = 0
    with broker.connection_errors():
        broker.client.delete(keys.key_turns)
        waiting = [key for key in broker.client.zrange(keys.key_waiting, 0, -1) if key != TOTAL]
        for key in waiting:
            gone = 0
            while n := broker.commands.purge(keys, "", 500, set_key=keys.parked(key)):
                gone += n
            if gone:
                pipe = broker.client.pipeline(transaction=False)
                pipe.zincrby(keys.key_waiting, -gone, key)
                pipe.zincrby(keys.key_waiting, -gone, TOTAL)
                pipe.zremrangebyscore(keys.key_waiting, "-inf", 0)
                pipe.execute()
            removed += gone
    return removed
