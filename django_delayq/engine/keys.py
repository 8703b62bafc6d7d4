"""Every Redis key django-delayq uses, built in one place.

All keys of one queue (or one shard of a queue) share the hash tag ``{prefix:queue}``
(``{prefix:queue#shard}`` for shards), so a queue's Lua scripts touch a single Redis
Cluster slot. Lua scripts receive these names through ``KEYS``; the only names a script
derives are a job key, a concurrency key's parked set and a dedupe record, each from a
prefix it is given here (``job_prefix``, ``park_prefix``, ``dedupe_prefix``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from .status import STATUSES

# \Z, not $: "$" also matches before a trailing newline, which would let "q\n" through.
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.:@+=/\-]{1,128}\Z")
#: Space-separated job ids with neither '.' nor '/' (the parts rule has nothing to check).
_PLAIN_JOB_IDS_RE = re.compile(r"[A-Za-z0-9_:@+=\-]{1,128}(?: [A-Za-z0-9_:@+=\-]{1,128})*\Z")


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it is a valid queue name, else raise ``ValueError``."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise ValueError(
            f"invalid queue name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . -"
        )
    return name


#: The suffixes of the keys a job's workflow keeps beside its hash (``lua/includes/
#: flows.lua``): its dependants, the parents it waits for, their results. A new job whose
#: id ends in one would share its key with another job's.
DEPENDANTS, UNRESOLVED, RESULTS = ":c", ":w", ":r"
DERIVED_SUFFIXES = (DEPENDANTS, UNRESOLVED, RESULTS)


def validate_new_job_id(job_id: str) -> str:
    """:func:`validate_job_id` for the id of a job about to be written, which may not end
    in one of :data:`DERIVED_SUFFIXES`: job ``x:c``'s hash would be job ``x``'s set of
    dependants, so cancelling one would delete the other, and linking either would fail."""
    validate_job_id(job_id)
    if job_id.endswith(DERIVED_SUFFIXES):
        raise ValueError(f"invalid job id {job_id[:80]!r}: an id may not end in "
                         f"{', '.join(DERIVED_SUFFIXES)} (the keys another job's workflow "
                         "keeps beside its hash)")
    return job_id


def validate_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is a valid job id, else raise ``ValueError``.

    A job id is 1-128 characters from ``A-Z a-z 0-9 _ . : @ + = / -``; as ``/`` may
    separate its parts, no part may be empty, ``.`` or ``..`` (a URL holding such an id
    would be rewritten by clients and servers, so the API could not reach the job).
    """
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        shown = job_id if not isinstance(job_id, str) else job_id[:80]
        raise ValueError(
            f"invalid job id {shown!r}: use 1-128 characters from A-Z a-z 0-9 _ . : @ + = / -"
        )
    if "/" in job_id or job_id in (".", ".."):
        parts = job_id.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"invalid job id {job_id[:80]!r}: the parts between '/' may not "
                             "be empty, '.' or '..'")
    return job_id


def split_job_ids(text: str) -> list[str]:
    """The job ids of a space-separated list (as a stream entry names them), each checked
    as :func:`validate_job_id` does (``ValueError`` for the first that is not one)."""
    job_ids = text.split(" ")
    if not _PLAIN_JOB_IDS_RE.match(text):  # one match for the common case: all plain
        for job_id in job_ids:
            validate_job_id(job_id)
    return job_ids


@dataclass(frozen=True, eq=True)
class QueueKeys:
    """The keys of one queue shard. ``shard`` is ``None`` for an unsharded queue."""

    prefix: str
    queue: str
    shard: int | None = None

    def __hash__(self) -> int:
        return hash(self.tag)

    @cached_property
    def tag(self) -> str:
        suffix = "" if self.shard is None else f"#{self.shard}"
        return f"{{{self.prefix}:{self.queue}{suffix}}}"

    def _key(self, name: str) -> str:
        return f"{self.tag}:{name}"

    @cached_property
    def scheduled(self) -> str:
        return self._key("scheduled")

    @cached_property
    def ready(self) -> str:
        return self._key("ready")

    @cached_property
    def active(self) -> str:
        return self._key("active")

    @cached_property
    def completed(self) -> str:
        return self._key("completed")

    @cached_property
    def failed(self) -> str:
        return self._key("failed")

    @cached_property
    def cancelled(self) -> str:
        return self._key("cancelled")

    @cached_property
    def waiting(self) -> str:
        """Jobs waiting for their parents, by enqueued time (ZSET; see lua/includes/flows.lua)."""
        return self._key("waiting")

    @cached_property
    def flow_outbox(self) -> str:
        """Resolutions of dependants in other shards, still to deliver (LIST of JSON)."""
        return self._key("flow:outbox")

    @cached_property
    def flow_linking(self) -> str:
        """Waiting jobs whose links to parents in other shards are not yet confirmed, by
        enqueued time (ZSET; a heartbeat links those left there too long again)."""
        return self._key("flow:linking")

    def batches(self, group: str) -> str:
        """The batches in progress of the consumers of ``group`` on this shard's events
        stream: consumer -> '<first id> <last id>' (HASH; see engine/streams.py)."""
        return self._key(f"batches:{group}")

    @cached_property
    def marker(self) -> str:
        return self._key("marker")

    @cached_property
    def events(self) -> str:
        return self._key("events")

    @cached_property
    def seq(self) -> str:
        return self._key("seq")

    @cached_property
    def paused(self) -> str:
        return self._key("paused")

    @cached_property
    def limit(self) -> str:
        return self._key("limit")

    @cached_property
    def stats(self) -> str:
        """Per-minute completed/failed counters (HASH ``c:<minute>`` / ``f:<minute>``)."""
        return self._key("stats")

    @cached_property
    def skipped(self) -> str:
        """How many events the mirror or the lake export could not use and skipped (STRING)."""
        return self._key("mirror:skipped")

    @cached_property
    def skipped_log(self) -> str:
        """The newest reasons of those skips, newest first (LIST, capped)."""
        return self._key("mirror:skipped:log")

    @cached_property
    def key_active(self) -> str:
        """Concurrency key -> how many of its jobs are leased now (ZSET; see
        lua/includes/keyed_ctx.lua)."""
        return self._key("keys:active")

    @cached_property
    def key_waiting(self) -> str:
        """Concurrency key -> how many of its jobs wait for one of its slots (ZSET; the
        member '' holds the total)."""
        return self._key("keys:waiting")

    @cached_property
    def key_turns(self) -> str:
        """Concurrency key -> the FIFO number of its last job made ready (HASH; fair turns)."""
        return self._key("keys:turns")

    @cached_property
    def park_prefix(self) -> str:
        """Prefix of each concurrency key's jobs waiting for a slot (ZSET ``<prefix><key>``
        by ready score; the scripts derive it, like a job key)."""
        return self._key("kw:")

    @cached_property
    def key_rate_prefix(self) -> str:
        """Prefix of each concurrency key's start-rate window (ZSET ``<prefix><key>``,
        as a queue's ``limit``; the claim script derives it)."""
        return self._key("kr:")

    def parked(self, key: str) -> str:
        return f"{self.park_prefix}{key}"

    @cached_property
    def dedupe_prefix(self) -> str:
        """Prefix of each dedupe key's record (STRING ``<prefix><key>``: the job id it
        points at, with a time to live; the enqueue script derives it)."""
        return self._key("dd:")

    def dedupe(self, key: str) -> str:
        return f"{self.dedupe_prefix}{key}"

    @cached_property
    def job_prefix(self) -> str:
        return self._key("j:")

    def job(self, job_id: str) -> str:
        return f"{self.job_prefix}{job_id}"

    def dependants(self, job_id: str) -> str:
        """SET of the dependants linked to a job (``<job key>:c``; the scripts derive it
        from the job key, see ``lua/includes/flows.lua``)."""
        return f"{self.job(job_id)}{DEPENDANTS}"

    def unresolved(self, job_id: str) -> str:
        """SET of the indexes (1-based) of the parents a waiting job still waits for
        (``<job key>:w``; see ``lua/includes/flows.lua``)."""
        return f"{self.job(job_id)}{UNRESOLVED}"

    def status_set(self, status: str) -> str:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
        return self._key(status)


def schedule_record(task: str) -> str:
    """The field of :attr:`GlobalKeys.schedules` that holds ``task``'s schedule record,
    next to its mark (the field named as the task). A line break: in no task's name."""
    return f"{task}\nschedule"


@dataclass(frozen=True)
class GlobalKeys:
    """Keys shared by every queue: the registry of queues and of live workers."""

    prefix: str

    @property
    def queues(self) -> str:
        """SET of queue names seen by enqueuers and workers."""
        return f"{self.prefix}:queues"

    @property
    def workers(self) -> str:
        """ZSET of worker ids by last heartbeat (ms, Redis clock)."""
        return f"{self.prefix}:workers"

    @property
    def hosts(self) -> str:
        """ZSET of the hosts among them (``runworker`` and ``delayq_mirror`` processes,
        which run no job) by last heartbeat: what the count of workers leaves out."""
        return f"{self.prefix}:hosts"

    def worker(self, worker_id: str) -> str:
        """HASH describing one worker (host, pid, queues, started, jobs done)."""
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def schedules(self) -> str:
        """HASH task name -> the latest occurrence (ms) of that periodic task enqueued;
        and :func:`schedule_record` of the task -> the schedule that mark was made under
        (``lua/includes/schedule_record.lua``)."""
        return f"{self.prefix}:schedules"

    @property
    def schedule_defs(self) -> str:
        """HASH task name -> JSON: the schedule a worker runs the periodic task on (its
        queue, cron and zone or period) and when a worker last said so (ms)."""
        return f"{self.prefix}:schedule_defs"
