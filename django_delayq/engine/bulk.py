"""A bulk enqueue (:meth:`Broker.enqueue_many`): its jobs encoded a chunk at a time,
each chunk sent by shard while the next is encoded, its replies counted in call order,
and its waiting jobs linked to their parents in other shards.

Encoding a chunk (validation, JSON, ids) is Python work; running it is Redis work, and
the two overlap. A plain call (:class:`Pipelined`) writes chunk *n + 1* before it reads
the reply of chunk *n*, all on the caller's thread, so Redis always has a chunk to run
while Python encodes and counts. Other calls (sharded, waiting for replicas, on a
cluster) use :class:`.chunk_thread.ChunkSender`, which sends chunk *n* on a thread while
the caller encodes chunk *n + 1* (a single-chunk call is sent inline, with no thread).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from . import flows
from .chunk_thread import ChunkSender
from .commands import EncodedJob
from .core import BrokerCore
from .errors import NotReplicated
from .failover import FAILOVER
from .keyed import OUTCOMES
from .keys import QueueKeys
from .pinned import PinnedConnections
from .requests import BulkResult, EnqueueRequest, EnqueueResult, new_job_ids
from .status import Status

#: A job of a bulk call: encoded, with the parents it waits for (None: none).
Outgoing = tuple[EncodedJob, flows.Dependencies | None]


def split_waits(broker: BrokerCore, keys: QueueKeys,
                items: Sequence[Outgoing]) -> tuple[list[EncodedJob], list[list[Any]]]:
    """The enqueue script's jobs and flow values of ``items``, jobs of the shard ``keys``
    (the script links each to its parents of that shard)."""
    jobs = [job for job, _ in items]
    waits = [deps.waits(index, deps.split(broker, keys)[0])
             for index, (_, deps) in enumerate(items, 1) if deps is not None]
    return jobs, waits


class BulkEnqueue:
    """One call of :meth:`Broker.enqueue_many` on ``queue``: what it sent is added to
    ``total`` (and ``results``) as the shards answer, so an error leaves them right."""

    def __init__(self, broker: BrokerCore, queue: str, total: BulkResult,
                 results: list[EnqueueResult] | None) -> None:
        self.broker = broker
        self.queue = queue
        self.total = total
        self.results = results
        #: A job of a dedupe mode's own id -> the id of the job in effect for it.
        self.in_effect: dict[str, str] = {}
        self._pipe: Pipelined | None = None

    def run(self, requests: Iterable[EnqueueRequest], chunk_size: int,
            encoded: Sequence[Outgoing] = ()) -> None:
        """Encode ``requests`` (after the ready ``encoded`` jobs) and send them, a chunk
        of ``chunk_size`` per round trip."""
        broker, queue, total = self.broker, self.queue, self.total
        chunk: list[Outgoing] = []
        checked: set[tuple[str, int, int]] = set()
        ids = new_job_ids(min(chunk_size, 1_000))
        shards = broker.shard_count(queue)
        known: set[tuple[str, str]] = set()  # the jobs of this call so far
        pinned = broker.commands.pinned
        if shards == 1 and pinned is not None and broker.replica_wait() is None:
            self._pipe = Pipelined(self, pinned)
        with broker.connection_errors():
            # Chunk n runs while chunk n + 1 is encoded (one round trip per chunk).
            sender = ChunkSender(self.send_now)
            try:
                chunk += encoded
                for request in requests:
                    job = broker.encode_request(request, checked=checked, ids=ids,
                                                shards=shards)
                    deps = None
                    if request.depends_on is not None:
                        deps = flows.dependencies(request.depends_on, queue,
                                                  request.on_parent_failure,
                                                  request.pass_results)
                    if deps is not None:
                        flows.check_parents_exist(
                            broker, [p for p in deps.parents if p not in known])
                    known.add((queue, job.job_id))
                    chunk.append((job, deps))
                    if len(chunk) >= chunk_size:
                        self._send(chunk, sender)
                        chunk = []
                if chunk:
                    self._send(chunk, sender)
            except (TypeError, ValueError) as exc:
                self._finish(sender)
                raise type(exc)(f"{exc} (enqueue_many stopped: {total.enqueued} jobs of "
                                f"earlier chunks were enqueued, this chunk was not)") from exc
            finally:
                self._finish(sender)

    def _finish(self, sender: ChunkSender) -> None:
        """Wait until every chunk is sent and answered."""
        try:
            sender.finish()
        finally:
            if self._pipe is not None:
                self._pipe.close()

    def _by_shard(self, chunk: list[Outgoing]) -> dict[QueueKeys, list[Outgoing]]:
        """The jobs of ``chunk`` grouped by the shard their id picks."""
        broker, queue = self.broker, self.queue
        if broker.shard_count(queue) == 1:
            return {broker.keys_for(queue, ""): chunk}
        by_shard: dict[QueueKeys, list[Outgoing]] = {}
        for item in chunk:
            by_shard.setdefault(broker.keys_for(queue, item[0].job_id), []).append(item)
        return by_shard

    def _send(self, chunk: list[Outgoing], sender: ChunkSender) -> None:
        """Send one chunk: pipelined until the call's first chunk holding a job that
        waits for parents, and from there (once the chunks pipelined are answered)
        through ``sender``, one chunk answered before the next is sent: a waiting job
        whose parents a chunk still in flight holds would find them missing if Redis
        refused that chunk."""
        pipe = self._pipe
        if pipe is not None:
            if all(deps is None for _, deps in chunk):
                pipe.send(chunk)
                return
            self._pipe = None
            pipe.close()
        sender.send(chunk)

    def answered(self, reply: list[Any], chunk: list[Outgoing]) -> None:
        """Count the reply of a chunk sent in one call (:class:`Pipelined`), and link
        what it asks to be linked."""
        self.total.chunks += 1
        sent = [(self._rows(reply, chunk), chunk)]
        self._count_sent(sent)
        self._link_elsewhere(sent)

    def send_now(self, chunk: list[Outgoing]) -> None:
        """Send one chunk (one call per shard), through a failover with the same ids."""
        broker = self.broker
        by_shard = self._by_shard(chunk)  # checks the queue name
        single = len(by_shard) == 1
        broker.remember_queue(self.queue)  # once a chunk is valid: a refusal leaves no trace
        wait = broker.replica_wait()
        deadline = None
        confirmed: int | None = None
        answered: dict[QueueKeys, Any] = {}  # the reply of each shard that answered
        counted = False
        try:
            while True:
                try:
                    sent, sent_confirmed = self._send_by_shard(by_shard, wait)
                except FAILOVER as exc:  # the same ids again: a retry cannot add a job twice
                    deadline = self.broker.retry_or_raise(exc, deadline)
                    continue
                if not counted:
                    self.total.chunks += 1
                    counted = True
                if sent_confirmed is not None:
                    confirmed = sent_confirmed if confirmed is None else min(confirmed,
                                                                             sent_confirmed)
                failed = []
                for keys, reply, items in sent:
                    if isinstance(reply, Exception):
                        failed.append((keys, reply, items))
                    else:
                        answered[keys] = self._rows(reply, items)
                refusal = next((reply for _, reply, _ in failed
                                if not isinstance(reply, FAILOVER)), None)
                if refusal is not None:
                    raise refusal
                if not failed:
                    break
                # Shards whose reply is a failover error (their node died or was demoted,
                # their slot is moving) are sent again, alone, with the same ids.
                deadline = self.broker.retry_or_raise(failed[0][1], deadline)
                by_shard = {keys: items for keys, _, items in failed}
        finally:
            # What the shards that answered added counts, even when the call raises.
            sent_in_order = ([(reply, chunk) for reply in answered.values()] if single
                             else self._in_call_order(chunk, answered))
            self._count_sent(sent_in_order)
        # Only now that every shard answered are the parents of this chunk stored: a
        # dependant linked while its parent's shard was still being retried would find
        # it missing. (On an error, its dependants stay in the linking set: a
        # heartbeat's repair links them.)
        self._link_elsewhere(sent_in_order)
        if wait is not None and confirmed is not None and confirmed < wait[0]:
            raise NotReplicated([job.job_id for job, _ in chunk], confirmed, *wait)

    def _in_call_order(self, chunk: list[Outgoing],
                       answered: dict[QueueKeys, Any]) -> list[tuple[Any, list[Outgoing]]]:
        """The replies of the shards that ``answered`` and their jobs, in the order of
        ``chunk`` (the shards are sent one call each, so their replies come shard by
        shard): ``BulkResult.job_ids``, ``results`` and the workflows that zip their
        steps with them see the jobs as the caller gave them."""
        reply_rows: list[Any] = []
        items: list[Outgoing] = []
        cursor = dict.fromkeys(answered, 0)
        for item in chunk:
            keys = self.broker.keys_for(self.queue, item[0].job_id)
            reply = answered.get(keys)
            if reply is None:
                continue  # its shard did not answer
            at = cursor[keys]
            cursor[keys] = at + 4
            reply_rows += reply[at:at + 4]
            items.append(item)
        return [(reply_rows, items)]

    def _rows(self, reply: list[Any], items: list[Outgoing]) -> list[Any]:
        """A shard's reply, 4 values a job: the ids in effect of its jobs with a dedupe
        mode, which follow them, go to :attr:`in_effect`."""
        rows = reply[:4 * len(items)]
        deduped = [job.job_id for job, _ in items if job.keyed and job.keyed.dedupe_mode]
        for job_id, effective in zip(deduped, reply[4 * len(items):], strict=True):
            if effective and effective != job_id:
                self.in_effect[job_id] = effective
        return rows

    def _count_sent(self, sent: list[tuple[Any, list[Outgoing]]]) -> None:
        """Add the jobs of the replies ``sent`` (4 values a job) to the totals (and
        ``results``)."""
        total, results, in_effect = self.total, self.results, self.in_effect
        for reply, items in sent:
            ids = [in_effect.get(job.job_id, job.job_id) for job, _ in items]
            added = [int(flag) for flag in reply[0::4]]
            total.job_ids += ids
            new = added.count(1)
            total.enqueued += new
            total.replaced += added.count(2)
            total.ignored += added.count(3)
            if 0 in added:
                duplicates = [job_id for job_id, flag in zip(ids, added, strict=True)
                              if not flag]
                total.duplicates += len(duplicates)
                total.duplicate_ids += duplicates
            if results is not None:
                results += [
                    EnqueueResult(job_id, flag == 1, status, int(run_at_ms),
                                  int(enqueued_at_ms), OUTCOMES[flag])
                    for job_id, flag, status, run_at_ms, enqueued_at_ms in zip(
                        ids, added, reply[1::4], reply[2::4], reply[3::4], strict=True)
                ]

    def _link_elsewhere(self, sent: list[tuple[Any, list[Outgoing]]]) -> None:
        """After every shard of a chunk answered: link the new waiting jobs to their
        parents in other shards (the script linked those of their own), and link again
        the jobs that were already there and still wait (their first producer may have
        died before linking them)."""
        broker, queue = self.broker, self.queue
        new: list[tuple[QueueKeys, str, list[flows.Link]]] = []
        again: list[tuple[QueueKeys, str]] = []
        for reply, items in sent:
            for (job, deps), added, status in zip(items, reply[0::4], reply[1::4],
                                                  strict=True):
                if int(added) == 1 and deps is not None:
                    keys = broker.keys_for(queue, job.job_id)
                    _, elsewhere = deps.split(broker, keys)
                    if elsewhere:
                        new.append((keys, job.job_id, elsewhere))
                elif not added and status == Status.WAITING:
                    again.append((broker.keys_for(queue, job.job_id), job.job_id))
        if new:
            flows.link(broker, new)
        if again:
            flows.relink(broker, again)

    def _send_by_shard(
        self, by_shard: dict[QueueKeys, list[Outgoing]], wait: tuple[int, int] | None,
    ) -> tuple[list[tuple[QueueKeys, Any, list[Outgoing]]], int | None]:
        """Send one enqueue call per shard (and WAIT, with ``wait``): per shard its keys,
        its reply (an error in its place) and its jobs, and how many replicas confirmed
        the calls that succeeded (None without ``wait``)."""
        broker = self.broker
        commands = broker.commands
        if len(by_shard) == 1 and commands.pinned is not None:
            # One shard: one script call on a pinned connection, without a pipeline.
            ((keys, items),) = by_shard.items()
            jobs, waits = split_waits(broker, keys, items)
            if wait is None:
                return [(keys, commands.enqueue(keys, jobs, waits), items)], None
            reply, confirmed = commands.enqueue_and_wait(keys, jobs, wait, waits)
            return [(keys, reply, items)], confirmed
        batch = broker.batch()
        order = [(keys, commands.add_enqueue(batch, keys, *split_waits(broker, keys, items)),
                  items) for keys, items in by_shard.items()]
        # A shard that refuses its call (its cluster slot is moving) must not hide what
        # the others added: they are counted in ``total`` before the error is raised.
        replies = batch.run(raise_on_error=False, wait=wait)
        return [(keys, replies[index], items) for keys, index, items in order], batch.confirmed


class Pipelined:
    """The chunks of a plain bulk call (one shard, no replica wait, no job waiting for
    parents) on one held connection, each written before the reply of the one before it
    is read, on the caller's thread: Redis runs a chunk while Python encodes the next and
    counts the one before, where one call in flight at a time left Redis waiting on
    Python and the other way round (docs/benchmarks.md measures both).

    A reply lost (the connection, a failover, a script Redis forgot) sends the chunks not
    yet answered again as :meth:`BulkEnqueue.send_now` does, with the same ids, so none is
    added twice. A refusal is raised once the chunk sent after it is answered and counted:
    that one reached Redis before the refusal was known.
    """

    def __init__(self, bulk: BulkEnqueue, pinned: PinnedConnections) -> None:
        self.bulk = bulk
        self.pinned = pinned
        self.conn: Any = None
        self.in_flight: list[list[Outgoing]] = []  # sent and not answered, oldest first

    def send(self, chunk: list[Outgoing]) -> None:
        broker, queue = self.bulk.broker, self.bulk.queue
        keys = broker.keys_for(queue, "")  # checks the queue name
        broker.remember_queue(queue)
        command = broker.commands.enqueue_command(keys, [job for job, _ in chunk])
        if self.conn is None:
            self.conn = self.pinned.hold()
        self.in_flight.append(chunk)  # before the write: its reply is due from then on
        try:
            self.pinned.send(self.conn, *command, replies_due=len(self.in_flight) > 1)
        except Exception:
            self._send_again(self.in_flight)
            return
        except BaseException:  # maybe half written: that connection is done
            self._let_go(in_step=False)
            raise
        if len(self.in_flight) > 1:
            self._answer_oldest()

    def close(self) -> None:
        """Read the reply of every chunk in flight, then give the connection back."""
        try:
            while self.in_flight:
                self._answer_oldest()
        finally:
            self._let_go(in_step=not self.in_flight)

    def _answer_oldest(self) -> None:
        try:
            reply = self.pinned.read(self.conn)
        except (*FAILOVER, NoScriptError):
            self._send_again(self.in_flight)
            return
        except ResponseError:
            self.in_flight.pop(0)
            self.bulk.total.chunks += 1  # as send_now counts a refused chunk
            self._answer_after_refusal()
            raise
        except BaseException:
            self._let_go(in_step=False)
            raise
        self.bulk.answered(reply, self.in_flight.pop(0))

    def _answer_after_refusal(self) -> None:
        """Count what the chunks sent after a refused one added (they may be refused
        too: the first refusal is the one raised)."""
        while self.in_flight:
            try:
                reply = self.pinned.read(self.conn)
            except ResponseError:
                self.in_flight.pop(0)
                self.bulk.total.chunks += 1
                continue
            except Exception:  # lost: the refusal is what the call raises
                self._let_go(in_step=False)
                return
            except BaseException:
                self._let_go(in_step=False)
                raise
            self.bulk.answered(reply, self.in_flight.pop(0))

    def _send_again(self, chunks: list[list[Outgoing]]) -> None:
        self._let_go(in_step=False)
        for chunk in chunks:
            self.bulk.send_now(chunk)

    def _let_go(self, *, in_step: bool) -> None:
        """Give the held connection back, disconnected unless ``in_step`` (no reply left
        unread on it); the next send holds another."""
        self.in_flight = []
        if self.conn is not None:
            conn, self.conn = self.conn, None
            self.pinned.release(conn, in_step=in_step)
