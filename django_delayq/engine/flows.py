"""Workflows: jobs that wait for other jobs (``depends_on``), over any queues and slots.

A dependant is stored ``waiting`` by the enqueue script, which links it in the same call
to its parents of its own shard. Its parents in other shards are linked next
(``link.lua``, in each parent's shard), and the links confirmed in the dependant's shard
(``linked.lua``); until then it sits in that shard's linking set, and a worker's
heartbeat links it again (:func:`repair`) if its producer died or lost Redis before the
confirmation. A parent found already finished is resolved at once (``resolve.lua``, in
the dependant's shard). Linking twice is harmless. When a parent finishes for good, the
script that finishes it resolves its dependants of the same shard in the same call; for
a dependant in another shard (another queue, another Redis Cluster slot) it pushes an
entry to its own shard's outbox, which :func:`deliver` applies in the dependant's shard
and only then removes. Resolving is an idempotent SREM, so a delivery repeated after a
crash changes nothing: nothing is lost, nothing released twice
(``lua/includes/flows.lua``, ``docs/guarantees.md``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .core import BrokerCore
from .fields import stored
from .jobhash import parse_parents
from .keys import QueueKeys, validate_job_id, validate_queue_name
from .logfields import log
from .status import Status

logger = logging.getLogger(__name__)

#: What a dependant does when a parent fails for good, is cancelled or is gone.
POLICIES = ("cancel", "run", "fail")
#: What a dependant receives of its parents' results, as its first argument: nothing,
#: the (first) parent's result, or the list of every parent's result in order.
PASS_RESULTS = ("", "one", "all")
#: Outbox entries delivered per round trip.
DELIVER_BATCH = 500
#: A parent to link: its index among the dependant's parents (1-based), queue and id.
Link = tuple[int, str, str]
#: A parent's end to apply to a dependant (``resolve.lua``): the dependant's id, the
#: parent's index, its outcome ('completed', 'failed', 'cancelled', 'missing'), its id
#: and its result JSON.
Resolution = tuple[str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class Dependencies:
    """The parents a job waits for, and what it does with them."""

    parents: tuple[tuple[str, str], ...]
    #: 'cancel' (default), 'run' or 'fail' when a parent fails for good or is cancelled.
    on_parent_failure: str = "cancel"
    #: '' (nothing), 'one' or 'all': see :data:`PASS_RESULTS`.
    pass_results: str = ""

    def waits(self, index: int, here: Sequence[int]) -> list[Any]:
        """The enqueue script's 5 flow values for the job at ``index`` (1-based), whose
        parents at the indexes ``here`` (1-based) are in its own shard."""
        policy = "" if self.on_parent_failure == "cancel" else self.on_parent_failure
        return [index, json.dumps([list(p) for p in self.parents], separators=(",", ":")),
                policy, self.pass_results, " ".join(map(str, here))]

    def split(self, broker: BrokerCore, keys: QueueKeys) -> tuple[list[int], list[Link]]:
        """The indexes of the parents in the shard ``keys`` (the dependant's), and the
        ``(index, queue, id)`` of the others."""
        here: list[int] = []
        elsewhere: list[Link] = []
        for index, (queue, parent_id) in enumerate(self.parents, 1):
            if broker.keys_for(queue, parent_id) == keys:
                here.append(index)
            else:
                elsewhere.append((index, queue, parent_id))
        return here, elsewhere


def parent_ref(parent: Any, queue: str) -> tuple[str, str]:
    """``(queue, id)`` of a parent given as a job (anything with ``queue`` and ``id``), a
    ``(queue, id)`` pair, or a job id in ``queue`` (the dependant's own)."""
    if isinstance(parent, str):
        return queue, validate_job_id(parent)
    if isinstance(parent, tuple) and len(parent) == 2:
        return validate_queue_name(parent[0]), validate_job_id(parent[1])
    job_id, job_queue = getattr(parent, "id", None), getattr(parent, "queue", None)
    if isinstance(job_id, str) and isinstance(job_queue, str):
        return validate_queue_name(job_queue), validate_job_id(job_id)
    raise TypeError(f"depends_on takes jobs, job ids or (queue, id) pairs, not "
                    f"{type(parent).__name__}")


def dependencies(depends_on: Iterable[Any] | None, queue: str, on_parent_failure: str = "cancel",
                 pass_results: str = "") -> Dependencies | None:
    """The checked :class:`Dependencies` of a job of ``queue``, or None without parents."""
    if on_parent_failure not in POLICIES:
        raise ValueError(f"on_parent_failure must be one of {', '.join(POLICIES)}, "
                         f"not {on_parent_failure!r}")
    if pass_results not in PASS_RESULTS:
        raise ValueError(f"pass_results must be 'one', 'all' or '', not {pass_results!r}")
    if depends_on is None:
        return None
    if isinstance(depends_on, str) or not isinstance(depends_on, Iterable):
        raise TypeError("depends_on must be a list of jobs, job ids or (queue, id) pairs")
    parents = tuple(parent_ref(p, queue) for p in depends_on)
    if not parents:
        return None
    seen: set[tuple[str, str]] = set()
    for ref in parents:
        if ref in seen:
            raise ValueError(f"depends_on names job {ref[1]!r} of queue {ref[0]!r} twice")
        seen.add(ref)
    return Dependencies(parents, on_parent_failure, pass_results)


def check_parents_exist(broker: BrokerCore, parents: Iterable[tuple[str, str]]) -> None:
    """Raise ``ValueError`` naming the first parent that does not exist (one round trip).

    Parents must exist before their dependants, so a cycle cannot be built.
    """
    refs = list(dict.fromkeys(parents))
    if not refs:
        return
    pipe = broker.client.pipeline(transaction=False)
    for queue, job_id in refs:
        pipe.exists(broker.keys_for(queue, job_id).job(job_id))
    with broker.connection_errors():
        found = pipe.execute()
    for (queue, job_id), exists in zip(refs, found, strict=True):
        if not exists:
            raise ValueError(f"depends_on: no job {job_id!r} in queue {queue!r} (a parent must "
                             f"be enqueued before the jobs that wait for it)")


def member(child: QueueKeys, parent: QueueKeys, index: int, child_id: str) -> str:
    """How a parent's dependants SET names the dependant (see ``flows.lua``)."""
    if child == parent:
        return f"L {index} {child_id}"
    shard = "-" if child.shard is None else str(child.shard)
    return f"R {index} {child.queue} {shard} {child_id}"


def link(broker: BrokerCore, waiting: Sequence[tuple[QueueKeys, str, Sequence[Link]]], *,
         resolved: dict[QueueKeys, list[Resolution]] | None = None) -> None:
    """Link stored waiting jobs ``(shard, id, parents)`` to those parents, resolve at once
    the dependants of parents that already finished (and the ``resolved`` ones, per
    dependant shard), and confirm the links in each dependant's shard (a round trip for
    the links, one for the rest).

    Every step may run again: a dependant left unconfirmed is linked again by
    :func:`repair`, and linking or resolving twice changes nothing.
    """
    by_parent: dict[QueueKeys, list[tuple[str, str]]] = {}
    about: dict[QueueKeys, list[tuple[QueueKeys, str, int, str]]] = {}
    for child_keys, child_id, parents in waiting:
        for index, queue, parent_id in parents:
            parent_keys = broker.keys_for(queue, parent_id)
            by_parent.setdefault(parent_keys, []).append(
                (parent_id, member(child_keys, parent_keys, index, child_id)))
            about.setdefault(parent_keys, []).append((child_keys, child_id, index, parent_id))
    resolutions = {keys: list(items) for keys, items in (resolved or {}).items()}
    if by_parent:
        batch = broker.batch()
        calls = [(keys, broker.commands.add_link(batch, keys, links))
                 for keys, links in by_parent.items()]
        with broker.connection_errors():
            replies = batch.run()
        for keys, index in calls:
            reply = replies[index]
            for (child_keys, child_id, parent_index, parent_id), outcome, result in zip(
                    about[keys], reply[0::2], reply[1::2], strict=True):
                if outcome != "linked":
                    resolutions.setdefault(child_keys, []).append(
                        (child_id, str(parent_index), outcome, parent_id, result or "null"))
    linked: dict[QueueKeys, list[str]] = {}
    for child_keys, child_id, _ in waiting:
        linked.setdefault(child_keys, []).append(child_id)
    _resolve(broker, resolutions, linked)


def _resolve(broker: BrokerCore, resolutions: dict[QueueKeys, list[Resolution]],
             linked: dict[QueueKeys, list[str]] | None = None) -> None:
    """Apply resolutions per dependant shard, and confirm the ``linked`` dependants, in
    one round trip; then deliver what the resolutions pushed elsewhere."""
    batch = broker.batch()
    calls = [(keys, broker.commands.add_resolve(batch, keys, items))
             for keys, items in resolutions.items()]
    for keys, job_ids in (linked or {}).items():
        broker.commands.add_linked(batch, keys, job_ids)
    if not len(batch):
        return
    with broker.connection_errors():
        replies = batch.run()
    for keys, index in calls:
        if int(replies[index]):
            deliver(broker, keys)


@dataclass(slots=True)
class Relinked:
    """What :func:`relink` found of the jobs it was given."""

    #: Jobs still waiting: linked again to each parent they still wait for.
    waiting: list[str] = field(default_factory=list)
    #: Jobs no longer waiting (released, cancelled, purged): only confirmed.
    gone: list[str] = field(default_factory=list)
    #: ``(job id, what is wrong)`` for each parent a waiting job names that cannot exist
    #: (its stored parents are damaged): resolved as a missing parent, by its policy.
    damaged: list[tuple[str, str]] = field(default_factory=list)


def _stored_parent(index: str, parents: Sequence[tuple[str, str]]) -> tuple[str, str, str]:
    """The ``(queue, id)`` of the parent at ``index`` (a member of the job's unresolved
    set) and '', or a placeholder and what makes it unusable."""
    if not index.isdecimal() or not 1 <= int(index) <= len(parents):
        return "", "", f"parent {index[:20]!r} is not in the stored parents"
    queue, parent_id = parents[int(index) - 1]
    try:
        validate_queue_name(queue)
        validate_job_id(parent_id)
    except ValueError as exc:
        return queue, parent_id, str(exc)
    return queue, parent_id, ""


def relink(broker: BrokerCore, jobs: Sequence[tuple[QueueKeys, str]]) -> Relinked:
    """Link again the waiting jobs ``(shard, id)`` to each parent they still wait for,
    as :func:`link` does (jobs no longer waiting are only confirmed), and say what it
    found.

    What a repeated enqueue of a waiting job and :func:`repair` run: a dependant whose
    producer died (or lost Redis) between storing it and linking it is linked now. A
    parent whose stored queue or id cannot exist (damaged data) is resolved as a missing
    parent, so the job follows its policy and leaves the linking set.
    """
    found = Relinked()
    if not jobs:
        return found
    status_field, parents_field = stored("status"), stored("parents")
    pipe = broker.client.pipeline(transaction=False)
    for keys, job_id in jobs:
        pipe.hmget(keys.job(job_id), status_field, parents_field)
        pipe.smembers(keys.unresolved(job_id))
    with broker.connection_errors():
        replies = pipe.execute()
    todo: list[tuple[QueueKeys, str, list[Link]]] = []
    missing: dict[QueueKeys, list[Resolution]] = {}
    for (keys, job_id), (status, raw), unresolved in zip(jobs, replies[0::2], replies[1::2],
                                                          strict=True):
        pending: list[Link] = []
        if status != Status.WAITING:
            found.gone.append(job_id)
            todo.append((keys, job_id, pending))
            continue
        found.waiting.append(job_id)
        parents = parse_parents(raw)
        for index in sorted(map(str, unresolved), key=lambda i: (len(i), i)):
            queue, parent_id, problem = _stored_parent(index, parents)
            if not problem:
                pending.append((int(index), queue, parent_id))
                continue
            found.damaged.append((job_id, problem))
            missing.setdefault(keys, []).append(
                (job_id, index, "missing", repr(parent_id)[:80] if parent_id else "?", "null"))
        todo.append((keys, job_id, pending))
    link(broker, todo, resolved=missing)
    return found


def repair(broker: BrokerCore, keys: QueueKeys, job_ids: Sequence[str]) -> Relinked:
    """Link again the waiting jobs ``job_ids`` of the shard ``keys`` that the reclaim
    call found unconfirmed past the grace period (the heartbeat's part), and log what
    was found: the reclaim call hands each job to one heartbeat per grace period, so
    each is reported once."""
    found = relink(broker, [(keys, job_id) for job_id in job_ids])
    for job_id, problem in found.damaged:
        log(logger, logging.WARNING, "a waiting job names a parent that cannot exist "
            "(damaged data): resolved as a missing parent, its policy applies",
            queue=keys.queue, job=job_id, error=problem)
    if found.waiting:
        log(logger, logging.WARNING, "linked waiting jobs to their parents again: their "
            "producer did not confirm the links within the grace period (it stopped or "
            "lost Redis)", queue=keys.queue, jobs=len(found.waiting),
            ids=",".join(found.waiting[:10]))
    if found.gone:
        log(logger, logging.INFO, "jobs no longer waiting left the linking set (released, "
            "cancelled or purged before their producer confirmed the links)",
            queue=keys.queue, jobs=len(found.gone), ids=",".join(found.gone[:10]))
    return found


def deliver(broker: BrokerCore, keys: QueueKeys, *, limit: int = DELIVER_BATCH) -> int:
    """Deliver the outbox of the shard ``keys``: resolve each entry in its dependant's
    shard, then remove it. Returns how many entries were delivered.

    Any process may run this, at any time, as often as it likes: an entry is removed
    only after its resolution landed, and resolving again changes nothing. A crash
    between the two steps leaves the entry for the next delivery.
    """
    client, delivered = broker.client, 0
    while True:
        with broker.connection_errors():
            entries = client.lrange(keys.flow_outbox, 0, limit - 1)
        if not entries:
            return delivered
        resolutions: dict[QueueKeys, list[Resolution]] = {}
        for raw in entries:
            try:
                entry = json.loads(raw)
                _, index, queue, shard, child_id = entry["m"].split(" ", 4)
                child_keys = QueueKeys(broker.config.prefix, queue,
                                       None if shard == "-" else int(shard))
                resolution = (child_id, index, entry["o"], entry["p"], entry["v"])
            except (ValueError, KeyError, TypeError, AttributeError):
                # not written by the scripts (by hand?): dropped, so it cannot block the rest
                log(logger, logging.WARNING, "dropping an unreadable outbox entry",
                    shard=keys.tag, entry=raw[:200])
                continue
            resolutions.setdefault(child_keys, []).append(resolution)
        _resolve(broker, resolutions)
        pipe = client.pipeline(transaction=False)
        for raw in entries:
            pipe.lrem(keys.flow_outbox, 1, raw)
        with broker.connection_errors():
            pipe.execute()
        delivered += len(entries)
        if len(entries) < limit:
            return delivered


def children_of(broker: BrokerCore, queue: str, job_id: str) -> list[tuple[str, str]]:
    """The ``(queue, id)`` dependants linked to a job (kept while its hash lives)."""
    keys = broker.keys_for(queue, job_id)
    with broker.read_errors():
        members = broker.client.smembers(keys.dependants(job_id))
    return parse_dependants(queue, members)


@dataclass(frozen=True, slots=True)
class LinkedJob:
    """A job of a workflow as Redis holds it now."""

    #: Its status and task ('' for both once Redis no longer holds it).
    status: str
    task: str
    #: The ``(queue, id)`` of its parents, or of its dependants (see :func:`read_linked`).
    links: list[tuple[str, str]]


def read_linked(broker: BrokerCore, jobs: Sequence[tuple[str, str]], *,
                dependants: bool) -> list[LinkedJob | None]:
    """Each of the jobs ``(queue, id)`` with its parents (with ``dependants``: its
    dependants), in one round trip; None for a reference no key can name (damaged)."""
    fields = [stored("status"), stored("task"), stored("parents")]
    pipe = broker.client.pipeline(transaction=False)
    named: list[bool] = []
    for queue, job_id in jobs:
        try:
            keys = broker.keys_for(queue, job_id)
            job_key, links_key = keys.job(job_id), keys.dependants(job_id)
        except ValueError:
            named.append(False)
            continue
        pipe.hmget(job_key, fields)
        if dependants:
            pipe.smembers(links_key)
        named.append(True)
    with broker.read_errors():
        replies = iter(pipe.execute() if any(named) else [])
    found: list[LinkedJob | None] = []
    for (queue, _), ok in zip(jobs, named, strict=True):
        if not ok:
            found.append(None)
            continue
        status, task, parents = next(replies)
        links = parse_dependants(queue, next(replies)) if dependants else parse_parents(parents)
        found.append(LinkedJob(status or "", task or "", links))
    return found


def parse_dependants(queue: str, members: Iterable[str]) -> list[tuple[str, str]]:
    """The ``(queue, id)`` of each member of the dependants SET of a job of ``queue``."""
    out = []
    for m in sorted(members):
        parts = m.split(" ")
        if parts[0] == "L" and len(parts) == 3:
            out.append((queue, parts[2]))
        elif parts[0] == "R" and len(parts) == 5:
            out.append((parts[2], parts[4]))
    return out
