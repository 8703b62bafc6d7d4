"""Every Lua script of the engine as one typed method: the only place KEYS and ARGV are built.

Each ``.lua`` file documents its KEYS, ARGV and reply in its header; the method of the
same name here is that header in Python, so a change to a script's arguments is made in
two files side by side. Scripts that run alone are sent at once (the enqueue on the
pinned connections of :mod:`~django_delayq.engine.pinned`); those the worker sends together
have an ``add_`` method that appends the call to a :class:`~django_delayq.engine.scripts.Batch`
and returns its index in the batch's replies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import ResponseError

from .codec import cut_utf8
from .keyed import KeyedOptions, keyed_values
from .scripts import Batch, call_and_wait, is_cluster_client, run_script, script_command
from .status import Status

if TYPE_CHECKING:
    from .config import EngineConfig
    from .keys import QueueKeys
    from .pinned import PinnedConnections

#: An ack of a completed job: ``(job_id, attempt, result_json[, start ms[, run ms]])``.
CompleteAck = tuple[str, int, str] | tuple[str, int, str, int] | tuple[str, int, str, int, int]

#: Most bytes of a failed attempt's error line kept (ERROR_MAX_BYTES when smaller).
ERROR_LINE_BYTES = 2_000


class EncodedJob(NamedTuple):
    """One job as the enqueue script takes it: its 10 ARGV values, in ``enqueue.lua``'s
    order, and its keys (flow control; sent apart, only for jobs that have them).
    ``Broker.encode_request`` builds it (every check passed), the outbox stores its
    values, :meth:`Commands.enqueue` sends it."""

    job_id: str
    task: str
    args_json: str
    kwargs_json: str
    priority: int
    #: When it may start, epoch ms ('' for none: as soon as it is enqueued).
    run_at_ms: int | str
    #: Ms from its enqueue to its start ('' for none).
    delay_ms: int | str
    max_attempts: int
    #: Time limit of each attempt, ms ('' for none: the worker's default).
    timeout_ms: int | str
    #: W3C trace context of the enqueue ('' for none).
    traceparent: str = ""
    #: Concurrency and dedupe keys (engine/keyed.py), or None.
    keyed: KeyedOptions | None = None


def _enqueue_script(waits: Sequence[Any]) -> str:
    """``enqueue.lua`` with the workflow definitions when some job waits for parents, else
    without them (``enqueue_plain``, see :data:`.scripts.VARIANTS`)."""
    return "enqueue" if waits else "enqueue_plain"


class Commands:
    """The scripts of one Redis client, with the settings of one :class:`EngineConfig`."""

    def __init__(self, client: Any, config: EngineConfig,
                 pinned: PinnedConnections | None = None) -> None:
        self.client = client
        self.config = config
        self.pinned = pinned

    # -- producing ----------------------------------------------------------------

    def _enqueue_call(self, keys: QueueKeys, jobs: Sequence[EncodedJob],
                      waits: Sequence[Sequence[Any]] = ()) -> tuple[list[str], list[Any]]:
        """``jobs`` all on the shard ``keys``; ``waits``: per job that waits for parents,
        its index in ``jobs`` (1-based), parents JSON, policy ('' for cancel), results
        passed ('', 'one', 'all'), the indexes of its parents in this shard
        (space-separated)."""
        script_keys = [keys.scheduled, keys.ready, keys.marker, keys.events, keys.seq]
        script_keys += [keys.job(job.job_id) for job in jobs]
        script_keys.append(keys.stats)
        keyed: list[Any] = []
        args: list[Any] = [self.config.events_cap, len(waits), 0]
        for index, job in enumerate(jobs, 1):
            args += job[:10]
            if job.keyed is not None:
                keyed += keyed_values(index, job.keyed)
        if waits:
            for wait in waits:
                args += wait
            flow_keys, flow_args = self._flow_call(keys)
            script_keys += [*flow_keys, keys.flow_linking]
            args += flow_args
        if keyed:
            args[2] = len(keyed) // 9
            args += keyed
            script_keys += [keys.key_turns, keys.dedupe_prefix, keys.job_prefix]
        return script_keys, args

    def enqueue(self, keys: QueueKeys, jobs: Sequence[EncodedJob],
                waits: Sequence[Sequence[Any]] = ()) -> list[Any]:
        """Enqueue jobs now; per job 4 values: added (0/1), status, run_at ms, enqueued_at ms."""
        reply: list[Any] = run_script(self.client, _enqueue_script(waits),
                                      *self._enqueue_call(keys, jobs, waits), self.pinned)
        return reply

    def enqueue_command(self, keys: QueueKeys, jobs: Sequence[EncodedJob]) -> tuple[Any, ...]:
        """The EVALSHA of :meth:`enqueue` for ``jobs`` (none waiting for parents), to send
        on a held connection (:class:`.bulk.Pipelined`)."""
        return script_command(_enqueue_script(()), *self._enqueue_call(keys, jobs))

    def enqueue_and_wait(self, keys: QueueKeys, jobs: Sequence[EncodedJob],
                         wait: tuple[int, int],
                         waits: Sequence[Sequence[Any]] = ()) -> tuple[list[Any], int]:
        """:meth:`enqueue`, then Redis ``WAIT`` for ``wait = (replicas, timeout_ms)`` in
        the same round trip: the reply and how many replicas confirmed the jobs."""
        script_keys, args = self._enqueue_call(keys, jobs, waits)
        reply, confirmed = call_and_wait(self.client, _enqueue_script(waits), script_keys,
                                         args, wait, self.pinned)
        return list(reply), confirmed

    def add_enqueue(self, batch: Batch, keys: QueueKeys, jobs: Sequence[EncodedJob],
                    waits: Sequence[Sequence[Any]] = ()) -> int:
        """:meth:`enqueue` as one call of ``batch``."""
        return batch.add(_enqueue_script(waits), *self._enqueue_call(keys, jobs, waits))

    @staticmethod
    def _keyed_keys(keys: QueueKeys) -> list[str]:
        """The concurrency-key keys of a shard, as ``keyed_ctx`` (lua/includes/keyed_ctx.lua)
        takes them."""
        return [keys.key_active, keys.key_waiting, keys.key_turns, keys.park_prefix,
                keys.key_rate_prefix]

    # -- workflows (lua/includes/flows.lua) -----------------------------------------

    def _flow_call(self, keys: QueueKeys) -> tuple[list[str], list[Any]]:
        """The KEYS and ARGV every script that resolves dependants takes (``flow_ctx``)."""
        cfg = self.config
        return ([keys.scheduled, keys.ready, keys.marker, keys.seq, keys.cancelled,
                 keys.failed, keys.flow_outbox, keys.waiting, keys.events, keys.job_prefix,
                 keys.stats],
                [cfg.failed_ttl_ms, cfg.keep_failed, cfg.events_cap])

    def add_link(self, batch: Batch, keys: QueueKeys, links: Sequence[tuple[str, str]]) -> int:
        """Link ``(parent_id, dependant member)`` pairs to parents of the shard ``keys``;
        per link 2 values: 'linked' and '', or the parent's final outcome and result JSON."""
        args: list[Any] = []
        for parent_id, member in links:
            args += [parent_id, member]
        return batch.add("link", [keys.job_prefix], args)

    def add_linked(self, batch: Batch, keys: QueueKeys, job_ids: Sequence[str]) -> int:
        """Note that the waiting jobs ``job_ids`` of the shard ``keys`` are linked to every
        parent elsewhere (they leave the linking set); the reply is how many did."""
        return batch.add("linked", [keys.flow_linking], list(job_ids))

    def add_resolve(self, batch: Batch, keys: QueueKeys,
                    resolutions: Sequence[tuple[str, str, str, str, str]]) -> int:
        """Resolve ``(dependant id, parent index, outcome, parent id, result JSON)`` on
        the shard ``keys``; the reply is how many outbox entries that pushed."""
        script_keys, args = self._flow_call(keys)
        for resolution in resolutions:
            args += resolution
        return batch.add("resolve", script_keys, args)

    # -- reading events streams in batches (engine/streams.py) ------------------------

    def add_batch_read(self, batch: Batch, keys: QueueKeys, group: str, consumer: str,
                       count: int) -> int:
        """Read up to ``count`` new entries of the shard's stream as ``consumer``'s batch:
        ['busy'], or ['ok', the stream's newest id, entries...]."""
        return batch.add("batch_read", [keys.events, keys.batches(group)],
                         [group, consumer, count])

    def batch_claim(self, keys: QueueKeys, group: str, owner: str, taker: str,
                    min_idle_ms: int, count: int) -> list[Any]:
        """Move ``owner``'s batch in progress to ``taker``, whole: ['none'], or ['ok',
        first id, last id, deleted ids joined by spaces, entries...]."""
        return list(run_script(self.client, "batch_claim", [keys.events, keys.batches(group)],
                               [group, owner, taker, min_idle_ms, count]))

    def batch_ack(self, keys: QueueKeys, group: str, consumer: str, record: str,
                  ids: Sequence[str]) -> int:
        """Acknowledge a finished batch (``record``: '<first> <last>') and its entries."""
        return int(run_script(self.client, "batch_ack", [keys.events, keys.batches(group)],
                              [group, consumer, record, *ids]))

    def advance_schedule(self, marks_key: str, task: str, occurrence_ms: int,
                         record: str, tag: str) -> int:
        """Raise ``task``'s mark of the latest periodic occurrence enqueued (never lower
        it) while its ``record`` names the schedule ``tag``: the mark, or -1 (another
        schedule replaced it)."""
        return int(run_script(self.client, "advance_schedule", [marks_key],
                              [task, occurrence_ms, record, tag]))

    def hold_schedule(self, marks_key: str, task: str, record: str, tag: str,
                      since_ms: int, now_ms: int, stale_ms: int, spec: str,
                      switch_mark_ms: int) -> list[str]:
        """Which schedule ``task`` runs on, for a scheduler of schedule ``tag`` started
        at ``since_ms``: ['same', mark], ['switch', mark before, replaced spec] or
        ['held', the spec in effect] (``lua/hold_schedule.lua``)."""
        reply = run_script(self.client, "hold_schedule", [marks_key],
                           [task, record, tag, since_ms, now_ms, stale_ms, spec,
                            switch_mark_ms])
        return [str(v) for v in reply]

    # -- the worker protocol ------------------------------------------------------

    def add_claim(self, batch: Batch, keys: QueueKeys, count: int, worker: str, lease_ms: int,
                  limit_key: str, limit: int, period_ms: int) -> int:
        """Claim up to ``count`` jobs of the shard ``keys``; ``limit`` 0: no start limit
        here (else at most ``limit`` starts per ``period_ms`` in ``limit_key``)."""
        cfg = self.config
        return batch.add(
            "claim",
            [keys.scheduled, keys.ready, keys.active, keys.marker, keys.events, keys.seq,
             keys.paused, keys.job_prefix, limit_key, keys.failed, keys.stats,
             *self._keyed_keys(keys)],
            [count, lease_ms, worker, cfg.promote_batch, cfg.events_cap, limit, period_ms],
        )

    def add_start(self, batch: Batch, keys: QueueKeys, worker: str,
                  started: Sequence[tuple[str, int, int]]) -> int:
        """Mark ``(job_id, attempt, start ms)`` claimed jobs of ``keys`` active (a thread
        of ``worker`` started them); the reply is how many were."""
        args: list[Any] = [self.config.events_cap, worker]
        for job_id, attempt, start_ms in started:
            args += [job_id, attempt, start_ms]
        return batch.add("start", [keys.events, keys.job_prefix, keys.stats], args)

    def add_complete(self, batch: Batch, keys: QueueKeys,
                     done: Sequence[CompleteAck]) -> int:
        """Ack ``(job_id, attempt, result_json[, start ms[, run ms]])`` of the shard
        ``keys`` as completed (the start ms, 0 if unknown, goes to the attempt log if the
        job's own start was never noted; the run time, -1 if unknown, to the duration
        histogram, else the time from the start to the ack does)."""
        cfg = self.config
        flow_keys, args = self._flow_call(keys)
        args += [cfg.result_ttl_ms, cfg.keep_completed, cfg.events_cap]
        for job_id, attempt, result, *timing in done:
            args += [job_id, attempt, result, timing[0] if timing else 0,
                     timing[1] if len(timing) > 1 else -1]
        return batch.add(
            "complete",
            [keys.active, keys.completed, keys.events, keys.stats, keys.job_prefix, *flow_keys,
             *self._keyed_keys(keys)],
            args,
        )

    def add_fail(self, batch: Batch, keys: QueueKeys, job_id: str, attempt: int, error: str,
                 traceback: str, retry_delay_ms: int, started_ms: int = 0) -> int:
        """Record a failed attempt; ``retry_delay_ms`` -1 forbids a retry; ``started_ms``
        (0 if unknown) goes to the attempt log if the job's own start was never noted."""
        cfg = self.config
        flow_keys, flow_args = self._flow_call(keys)
        error = cut_utf8(error, min(ERROR_LINE_BYTES, cfg.error_max_bytes))
        traceback = cut_utf8(traceback, cfg.error_max_bytes, keep_end=True)
        return batch.add(
            "fail",
            [keys.job(job_id), keys.active, keys.scheduled, keys.failed, keys.marker,
             keys.events, keys.stats, *flow_keys, *self._keyed_keys(keys)],
            [job_id, attempt, error, traceback, retry_delay_ms, cfg.failed_ttl_ms,
             cfg.keep_failed, cfg.events_cap, started_ms, *flow_args],
        )

    def add_extend(self, batch: Batch, keys: QueueKeys, leases: Sequence[tuple[str, int]],
                   lease_ms: int) -> int:
        """Extend the leases ``(job_id, attempt)`` of the shard ``keys`` by ``lease_ms``;
        the reply is (ids of the leases lost, ``[id, who, ...]`` of the jobs whose abort
        was asked for)."""
        args: list[Any] = [lease_ms]
        for job_id, attempt in leases:
            args += [job_id, attempt]
        return batch.add("extend", [keys.active, keys.job_prefix], args)

    def add_reclaim(self, batch: Batch, keys: QueueKeys, limit: int, link_grace_ms: int,
                    worker: str = "", rank: int = 0) -> int:
        """Return up to ``limit`` expired leases to ready (or dead-letter them); the reply
        is (returned, dead-lettered, outbox entries still to deliver, ids of waiting jobs
        whose links elsewhere are unconfirmed for longer than ``link_grace_ms``)."""
        cfg = self.config
        flow_keys, flow_args = self._flow_call(keys)
        return batch.add(
            "reclaim",
            [keys.active, keys.ready, keys.failed, keys.marker, keys.events, keys.stats,
             keys.job_prefix, *flow_keys, keys.flow_linking, *self._keyed_keys(keys)],
            [limit, cfg.failed_ttl_ms, cfg.keep_failed, cfg.events_cap, *flow_args,
             link_grace_ms, worker, rank],
        )

    def add_release(self, batch: Batch, keys: QueueKeys, leases: Sequence[tuple[str, int]],
                    *, started: bool) -> int:
        """Hand leased jobs back to ready; their attempt counts if ``started``."""
        args: list[Any] = [self.config.events_cap, 0 if started else 1]
        for job_id, attempt in leases:
            args += [job_id, attempt]
        return batch.add(
            "release", [keys.active, keys.ready, keys.marker, keys.events, keys.job_prefix,
                        *self._keyed_keys(keys)], args)

    def reserve(self, limit_key: str, want: int, limit: int, period_ms: int,
                token: str) -> tuple[int, int]:
        """Take up to ``want`` starts of a window: (granted, ms until the next, or -1)."""
        granted, wait = run_script(self.client, "reserve", [limit_key],
                                   [want, limit, period_ms, token])
        return int(granted), int(wait)

    # -- the model mirror -----------------------------------------------------------

    def read_jobs(self, keys: QueueKeys,
                  job_ids: Sequence[str]) -> tuple[str, list[dict[str, str] | str]]:
        """The id of the newest entry of the events stream of the shard ``keys`` ('' if
        none) and the hashes of ``job_ids`` there, read at one instant: per job, its
        fields (empty: no such job), or the type of a key that is not a hash."""
        job_keys = [keys.job(job_id) for job_id in job_ids]
        if is_cluster_client(self.client):  # a cluster pipeline may not be a transaction
            reply = run_script(self.client, "read_jobs", [keys.events, *job_keys], [])
            return str(reply[0]), [dict(zip(flat[::2], flat[1::2], strict=True))
                                   if isinstance(flat, list) else str(flat)
                                   for flat in reply[1:]]
        # MULTI/EXEC reads at one instant too, in about a third of the script's Redis time
        # (a script turns each HGETALL reply into a Lua table and back): the mirror reads
        # a batch while workers wait on the same Redis.
        pipe = self.client.pipeline(transaction=True)
        pipe.xrevrange(keys.events, count=1)
        for key in job_keys:
            pipe.hgetall(key)
        newest, *found = pipe.execute(raise_on_error=False)
        if isinstance(newest, Exception):
            raise newest
        hashes: list[dict[str, str] | str] = [
            self.client.type(key) if isinstance(data, ResponseError) else data
            for key, data in zip(job_keys, found, strict=True)]  # WRONGTYPE: name its type
        return (newest[0][0] if newest else ""), hashes

    # -- one job --------------------------------------------------------------------

    def progress(self, keys: QueueKeys, job_id: str, attempt: int, fraction: float,
                 message: str) -> bool:
        """Record a running attempt's progress (and a ``progress`` event); False when the
        attempt no longer holds the job."""
        return bool(run_script(self.client, "progress", [keys.job(job_id), keys.events],
                               [job_id, attempt, repr(fraction), message,
                                self.config.events_cap, 1]))

    def cancel(self, keys: QueueKeys, job_id: str, who: str = "") -> tuple[str, int]:
        """Cancel a job that has not started, or with ``who`` (who asks) one that runs
        too (it is asked to stop): (its status before, '' if none; outbox entries pushed
        for its dependants in other shards)."""
        cfg = self.config
        flow_keys, flow_args = self._flow_call(keys)
        before, pushed = run_script(
            self.client, "cancel",
            [keys.job(job_id), keys.scheduled, keys.ready, keys.cancelled, keys.events,
             *flow_keys, *self._keyed_keys(keys)],
            [job_id, cfg.result_ttl_ms, cfg.keep_completed, cfg.events_cap, *flow_args,
             who],
        )
        return str(before), int(pushed)

    def reschedule(self, keys: QueueKeys, job_id: str, run_at_ms: int | str,
                   delay_ms: int | str, priority: int | str) -> tuple[str, str, int]:
        """Move a pending job ('' for what is unchanged): (status before, after, run_at ms)."""
        before, after, when = run_script(
            self.client, "reschedule",
            [keys.job(job_id), keys.scheduled, keys.ready, keys.marker, keys.events, keys.seq,
             *self._keyed_keys(keys), keys.job_prefix],
            [job_id, run_at_ms, delay_ms, priority, self.config.events_cap],
        )
        return before, after, int(when)

    def retry(self, keys: QueueKeys, job_id: str, run_at_ms: int | str,
              delay_ms: int | str) -> tuple[str, str, int, int]:
        """Run a failed or cancelled job again: (status before, status after, its
        attempts so far, its new max_attempts)."""
        before, after, attempts, most = run_script(
            self.client, "retry",
            [keys.job(job_id), keys.failed, keys.cancelled, keys.scheduled, keys.ready,
             keys.marker, keys.events, keys.seq],
            [job_id, run_at_ms, delay_ms, self.config.events_cap],
        )
        return before, after, int(attempts), int(most)

    def counters(self, keys: QueueKeys, minutes: bool = False) -> tuple[Any, ...]:
        """The call of ``counters.lua`` on the shard ``keys``, for a pipeline
        (:func:`~.scripts.execute_loading`): its stats with totals that never go back,
        and with ``minutes`` its per-minute counters."""
        return script_command("counters", [keys.stats], [int(minutes)])

    def purge(self, keys: QueueKeys, status: str, count: int, set_key: str = "") -> int:
        """Delete up to ``count`` jobs of ``status`` on the shard ``keys`` (or of the set
        ``set_key`` of that shard: a concurrency key's parked jobs); how many went."""
        flow_keys, flow_args = self._flow_call(keys)
        return int(run_script(self.client, "purge",
                              [set_key or keys.status_set(status), keys.events,
                               keys.job_prefix, *flow_keys],
                              [count, self.config.events_cap, *flow_args,
                               Status.READY if set_key else status]))
