"""Models that mirror job metadata from Redis, for history, search and the admin.

Redis stays the source of truth for queue state; :mod:`django_delayq.mirror` keeps these
rows in step from each queue's events stream.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .engine.status import Status

#: A mirrored job's status: the engine's (:class:`~django_delayq.engine.status.Status`),
#: and ``purged`` for a job removed from Redis before it finished (a purge, an orphan).
JobStatus = models.TextChoices(
    "JobStatus",
    [(status.name, (status.value, status.value.capitalize())) for status in Status]
    + [("PURGED", ("purged", "Purged"))],
)


class Job(models.Model):
    """One job as last mirrored from Redis. ``(queue, job_id)`` is unique."""

    job_id = models.CharField("job id", max_length=128)
    queue = models.CharField(max_length=64)
    task_name = models.CharField("task", max_length=200, db_index=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, db_index=True)
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    run_at = models.DateTimeField("run at", null=True, blank=True, db_index=True)
    enqueued_at = models.DateTimeField("enqueued at", null=True, blank=True)
    started_at = models.DateTimeField("started at", null=True, blank=True)
    finished_at = models.DateTimeField("finished at", null=True, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField("max attempts", default=1)
    worker = models.CharField(max_length=200, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    progress = models.FloatField(null=True, blank=True,
                                 help_text="Fraction done (0 to 1) the task last reported.")
    progress_message = models.CharField("progress message", max_length=500, blank=True)
    #: The last attempts, oldest first, as the job hash keeps them (``engine/fields.py``):
    #: ``{"n": attempt, "w": worker, "b": start ms, "f": end ms, "o": outcome, "x": error}``.
    attempt_log = models.JSONField("attempt log", default=list, blank=True)
    #: The jobs it waits (or waited) for, ``[[queue, id], ...]`` in order (``depends_on``).
    parents = models.JSONField(default=list, blank=True)
    #: The fields of the job record in Redis that could not be read (field -> what was
    #: found there), which the row holds as their defaults; null when none was damaged.
    damaged = models.JSONField(null=True, blank=True)
    #: Who asked for its abort or cancel through ``Job.abort()`` ('' when nobody did).
    aborted_by = models.CharField("aborted by", max_length=200, blank=True, default="",
                                  db_default="")
    #: The position in its queue shard's events stream (an entry id) the row is in step
    #: with: the job's state once every entry up to it was written. A write of an older
    #: position never replaces a newer one (``mirror/table.py``).
    last_event_id = models.CharField(max_length=40, blank=True)
    #: That position as the two numbers of the entry id, which SQL compares (0 and 0: not
    #: known, any write may replace the row).
    last_event_ms = models.BigIntegerField(default=0, db_default=0, editable=False)
    last_event_seq = models.BigIntegerField(default=0, db_default=0, editable=False)
    updated_at = models.DateTimeField("mirrored at", auto_now=True)
    #: Set by the mirror's reconciliation when Redis no longer holds this unfinished job
    #: (lost in a failover, its key removed by hand); cleared by any later event of it.
    missing_at = models.DateTimeField(
        "gone from Redis at", null=True, blank=True,
        help_text="when the mirror found this unfinished job gone from Redis (lost in a "
                  "failover, or deleted by hand): its status is the last one mirrored")

    class Meta:
        verbose_name = "job"
        verbose_name_plural = "jobs"
        ordering = ["-enqueued_at"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "job_id"], name="delayq_job_queue_job_id"),
        ]
        indexes = [
            models.Index(fields=["queue", "status"], name="delayq_job_queue_status"),
            models.Index(fields=["job_id"], name="delayq_job_job_id"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} [{self.job_id}]"

    @property
    def duration(self) -> float | None:
        """Seconds the last attempt ran, when it finished."""
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None

    @property
    def lateness(self) -> float | None:
        """Seconds between run_at and the start of the last attempt."""
        if self.started_at and self.run_at:
            return (self.started_at - self.run_at).total_seconds()
        return None


class QueuesDashboard(Job):
    """No table of its own: the admin index's entry that opens the queues dashboard."""

    class Meta:
        proxy = True
        verbose_name = "queues dashboard"
        verbose_name_plural = "queues dashboard"


class OutboxEntry(models.Model):
    """A job written in a database transaction, waiting to be sent to Redis.

    ``Task.enqueue_in_transaction`` inserts it with the transaction's other changes, so
    the job exists if and only if the transaction commits; the commit hook or the relay
    (:mod:`django_delayq.outbox`) sends it and deletes it. A row Redis refuses is parked
    (``parked_at`` set, with its error) for an operator to retry or delete.
    """

    job_id = models.CharField("job id", max_length=128)
    queue = models.CharField(max_length=64)
    task_name = models.CharField("task", max_length=200)
    #: The arguments as the JSON text a direct enqueue sends (a JSONField would let
    #: PostgreSQL's jsonb reorder the keys of dict arguments).
    args = models.TextField(default="[]")
    kwargs = models.TextField(default="{}")
    priority = models.SmallIntegerField(default=0)
    #: The absolute due time, fixed at the enqueue call; None: as soon as it is sent.
    run_at = models.DateTimeField("run at", null=True, blank=True)
    max_attempts = models.PositiveIntegerField("max attempts", default=1)
    #: Seconds each attempt may run (None: the worker's default), as ``Task.timeout``.
    timeout = models.FloatField(null=True, blank=True)
    #: The job's concurrency and dedupe keys as the engine takes them: a JSON list of
    #: ``engine.keyed.KeyedOptions``' values; "" when it has none. A database default
    #: too: an older version's writer, during a rolling upgrade, leaves it out.
    keyed = models.TextField("flow-control keys", blank=True, default="", db_default="")
    created_at = models.DateTimeField("written at", default=timezone.now)
    #: Sends that failed because Redis was unreachable.
    attempts = models.PositiveIntegerField("failed sends", default=0)
    error = models.TextField(blank=True)
    parked_at = models.DateTimeField("parked at", null=True, blank=True)

    class Meta:
        verbose_name = "job waiting in the outbox"
        verbose_name_plural = "jobs waiting in the outbox"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["parked_at", "id"], name="delayq_outbox_parked_id"),
            models.Index(fields=["job_id"], name="delayq_outbox_job_id"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} [{self.job_id}]"
