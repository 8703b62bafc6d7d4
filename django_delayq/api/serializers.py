"""Serializers of the API: what it answers (queues, jobs, workers) and what it accepts."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..conf import conf
from ..engine import validation
from ..engine.fields import ATTEMPT_TRACEBACK
from ..engine.jobhash import attempt_entries
from ..engine.keys import validate_new_job_id, validate_queue_name
from ..engine.status import JOB_STATUSES
from ..engine.validation import MAX_ATTEMPTS, MAX_PRIORITY, MIN_PRIORITY
from ..models import Job as MirroredJob
from ..models import JobStatus
from ..task import Task, registered, registry
from .jsonfields import JSONListField, JSONObjectField

# -- answers -------------------------------------------------------------------------


class TimeField(serializers.DateTimeField):
    """A time answered with its UTC offset, with ``USE_TZ`` on or off: a row's naive time
    (``USE_TZ`` off) is in ``TIME_ZONE``, where DRF would give it, and a time read from
    Redis, as a naive UTC time, with no offset to tell the two apart."""

    def default_timezone(self) -> dt.tzinfo:
        return timezone.get_current_timezone() if settings.USE_TZ else (
            timezone.get_default_timezone())


class QueueCountsSerializer(serializers.Serializer):
    """Jobs per status, live from Redis (finished ones: those still kept)."""

    waiting = serializers.IntegerField(help_text="Jobs waiting for their parents.")
    scheduled = serializers.IntegerField()
    ready = serializers.IntegerField()
    active = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()


class QueueSerializer(serializers.Serializer):
    name = serializers.CharField()
    counts = QueueCountsSerializer()
    paused = serializers.BooleanField()
    next_due = TimeField(allow_null=True,
                                         help_text="run_at of the earliest scheduled job.")
    shards = serializers.IntegerField()


class QueuePageSerializer(serializers.Serializer):
    """One page of the queue list (``limit`` and ``offset`` choose it)."""

    count = serializers.IntegerField(help_text="Queues in all.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = QueueSerializer(many=True)


class ThroughputSerializer(serializers.Serializer):
    minute = TimeField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()


class SkippedEventsSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Events the model mirror could not apply.")
    last = serializers.ListField(child=serializers.CharField(),
                                 help_text="The newest reasons, with time and stream id.")


class KeyCountSerializer(serializers.Serializer):
    key = serializers.CharField()
    jobs = serializers.IntegerField()


class KeyLoadSerializer(serializers.Serializer):
    """The busiest concurrency keys (docs/flow-control.md)."""

    active = KeyCountSerializer(many=True, help_text="Keys with the most jobs running.")
    waiting = KeyCountSerializer(many=True,
                                 help_text="Keys with the most jobs waiting for a slot.")
    waiting_total = serializers.IntegerField(
        help_text="Ready jobs waiting for a slot of their key, in all (counted as ready).")


class QueueDetailSerializer(QueueSerializer):
    mirror_skipped = SkippedEventsSerializer(
        help_text="Events the model mirror skipped (logged, acknowledged) as unusable.")
    tasks = serializers.ListField(child=serializers.CharField(),
                                  help_text="Registered tasks that send jobs to this queue.")
    throughput = ThroughputSerializer(many=True, help_text="The last 60 minutes, oldest first.")
    keys = KeyLoadSerializer(help_text="The 10 busiest concurrency keys.")


class AttemptSerializer(serializers.Serializer):
    """One attempt of a job, from its attempt log."""

    attempt = serializers.IntegerField()
    worker = serializers.CharField()
    started_at = TimeField(allow_null=True)
    finished_at = TimeField(allow_null=True)
    outcome = serializers.CharField(help_text="completed, retried, failed or reclaimed "
                                              "(the worker's lease lapsed).")
    error = serializers.CharField(help_text="Exception class and message (500 characters "
                                            "at most); empty when it completed.")
    traceback = serializers.CharField(help_text=f"The end of a failed attempt's traceback "
                                                f"(its last {ATTEMPT_TRACEBACK:,} bytes); "
                                                "empty otherwise.")


class LiveJobSerializer(serializers.Serializer):
    """A job as Redis holds it now (an engine ``Job``). ``error`` and ``traceback`` are
    "" when there is none, as in the mirrored row."""

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        for name in ("error", "traceback"):
            if data.get(name) is None:
                data[name] = ""
        return data

    id = serializers.CharField()
    queue = serializers.CharField()
    task = serializers.CharField(source="task_name")
    status = serializers.ChoiceField(choices=JOB_STATUSES)
    args = serializers.JSONField()
    kwargs = serializers.JSONField()
    priority = serializers.IntegerField()
    run_at = TimeField(allow_null=True)
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.CharField()
    traceback = serializers.CharField()
    worker = serializers.CharField(allow_null=True)
    enqueued_at = TimeField(allow_null=True)
    started_at = TimeField(allow_null=True)
    finished_at = TimeField(allow_null=True)
    progress = serializers.FloatField(allow_null=True,
                                      help_text="Fraction done (0 to 1) the task reported.")
    progress_message = serializers.CharField()
    timeout = serializers.FloatField(allow_null=True,
                                     help_text="The job's own time limit per attempt, seconds.")
    attempt_log = AttemptSerializer(many=True, help_text="The last attempts, oldest first.")
    concurrency_key = serializers.CharField(allow_null=True,
                                            help_text="Its concurrency key, if any.")
    waiting_for_slot = serializers.BooleanField(
        help_text="Ready, but waiting for a slot of its concurrency key (at its limit).")

    aborted_by = serializers.CharField(
        help_text="Who asked for its abort ('' when nobody did).")
    damaged = serializers.DictField(
        child=serializers.CharField(),
        help_text="Fields of the stored record that could not be read: field -> what was "
                  "found there (the field above then shows its default). Empty when sound.")


class EnqueuedJobSerializer(LiveJobSerializer):
    created = serializers.BooleanField(
        help_text="False when a job with this job_id existed: nothing was added.")


class MirroredJobSerializer(serializers.ModelSerializer):
    """A job as last mirrored into the database (history; may lag Redis)."""

    serializer_field_mapping = {**serializers.ModelSerializer.serializer_field_mapping,
                                models.DateTimeField: TimeField}

    class Meta:
        model = MirroredJob
        fields = ["job_id", "queue", "task_name", "status", "priority", "args", "kwargs",
                  "run_at", "enqueued_at", "started_at", "finished_at", "attempts",
                  "max_attempts", "worker", "result", "error", "progress", "progress_message",
                  "aborted_by", "updated_at", "missing_at"]
        read_only_fields = fields


class MirroredJobDetailSerializer(MirroredJobSerializer):
    attempt_log = serializers.SerializerMethodField()

    class Meta(MirroredJobSerializer.Meta):
        fields = [*MirroredJobSerializer.Meta.fields, "traceback", "attempt_log"]
        read_only_fields = fields

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempt_log(self, row: MirroredJob) -> Any:
        """The mirrored attempt log, read as the live one is (same names, same times)."""
        return AttemptSerializer(attempt_entries(row.attempt_log), many=True).data


class WorkflowJobSerializer(serializers.Serializer):
    """A parent or a dependant of a job, with its live status."""

    queue = serializers.CharField()
    job_id = serializers.CharField()
    task = serializers.CharField(allow_blank=True)
    status = serializers.CharField(help_text="Its live status; 'expired' once gone from Redis.")
    more = serializers.IntegerField(help_text="Its own parents (or dependants) left out: "
                                              "past the third level, or past 100 jobs.")


class WorkflowParentSerializer(WorkflowJobSerializer):
    """A job waited for, with the jobs it waits (or waited) for in turn."""

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["parents"] = WorkflowParentSerializer(many=True, help_text="Its own parents.")
        return fields


class WorkflowChildSerializer(WorkflowJobSerializer):
    """A job that waits (or waited), with the jobs that wait for it in turn."""

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["children"] = WorkflowChildSerializer(many=True,
                                                     help_text="Its own dependants.")
        return fields


class WorkflowSerializer(serializers.Serializer):
    parents = WorkflowParentSerializer(
        many=True, help_text="The jobs it waits (or waited) for, and theirs: a tree of at "
                             "most three levels.")
    children = WorkflowChildSerializer(
        many=True, help_text="The jobs that wait (or waited) for it, and theirs: a tree of "
                             "at most three levels.")
    parents_total = serializers.IntegerField(help_text="Its own parents in all.")
    children_total = serializers.IntegerField(help_text="Its own dependants in all.")


class JobDetailSerializer(serializers.Serializer):
    queue = serializers.CharField()
    job_id = serializers.CharField()
    workflow = WorkflowSerializer(help_text="Its parents and dependants (depends_on, chains, "
                                            "groups), live from Redis.")
    live = LiveJobSerializer(allow_null=True,
                             help_text="Redis state now; null once the job expired there.")
    position = serializers.IntegerField(
        allow_null=True, help_text="Jobs of its queue shard that run before it (waiting jobs).")
    mirror = MirroredJobDetailSerializer(
        allow_null=True, help_text="The mirrored row; null until the mirror has seen the job.")


class WorkerSerializer(serializers.Serializer):
    name = serializers.CharField()
    host = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    queues = serializers.ListField(child=serializers.CharField())
    concurrency = serializers.IntegerField(allow_null=True)
    processed = serializers.IntegerField(allow_null=True)
    failed = serializers.IntegerField(allow_null=True)
    busy = serializers.IntegerField(allow_null=True)
    started = TimeField(allow_null=True)
    heartbeat = TimeField(allow_null=True)
    role = serializers.ChoiceField(choices=["worker", "supervisor"],
                                   help_text="a worker, or the supervisor of a process pool")
    supervisor = serializers.CharField(allow_null=True,
                                       help_text="the supervisor of this worker's pool")
    damaged = serializers.DictField(child=serializers.CharField(),
                                    help_text="Unreadable fields: field -> what was found.")


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


# -- requests ------------------------------------------------------------------------


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date-time that must carry its UTC offset (naive ones are refused).
    A form draws it as text: a browser's date-time picker gives no offset."""

    default_error_messages = {
        "invalid_iso": "Not an ISO 8601 date-time: {value!r} (e.g. 2030-01-31T09:00:00Z).",
        "naive": "{value!r} has no time zone: add an offset such as Z or +02:00.",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("style", {"input_type": "text", "placeholder": "2030-01-31T09:00:00Z"})
        super().__init__(**kwargs)

    def to_internal_value(self, value: Any) -> dt.datetime:
        if not isinstance(value, str):
            self.fail("invalid_iso", value=value)
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
        if parsed is None:
            self.fail("invalid_iso", value=value)
        assert parsed is not None
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            self.fail("naive", value=value)
        return parsed


def _engine_check(check_value: Any, value: Any) -> None:
    """Run the engine's own check of ``value``: the API refuses what the Python API does."""
    try:
        check_value(value)
    except ValueError as exc:
        raise serializers.ValidationError(str(exc)) from None


class SecondsField(serializers.FloatField):
    """A delay in seconds: a number (JSON true/false are not), from 0 to 100 years."""

    default_error_messages = {"not_number": "A number of seconds is required, not {value!r}."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("not_number", value=data)
        value = super().to_internal_value(data)
        _engine_check(validation.delay_ms, value)
        return value


class StoredDateTimeField(AwareDateTimeField):
    """An aware date-time inside the range django-delayq stores (after 1970-01-01T00:00Z,
    up to 9998-12-31T00:00Z)."""

    def to_internal_value(self, value: Any) -> dt.datetime:
        parsed = super().to_internal_value(value)
        _engine_check(validation.run_at_ms, parsed)
        return parsed


def _check_when(attrs: dict[str, Any], *, required: bool) -> dict[str, Any]:
    given = [name for name in ("run_at", "delay") if attrs.get(name) is not None]
    if len(given) > 1:
        raise serializers.ValidationError("Give run_at or delay, not both.")
    if required and not given:
        raise serializers.ValidationError("Give run_at (ISO 8601 with an offset) or delay "
                                          "(seconds).")
    return attrs


def _priority_field() -> serializers.IntegerField:
    return serializers.IntegerField(
        required=False, min_value=MIN_PRIORITY, max_value=MAX_PRIORITY,
        help_text=f"{MIN_PRIORITY} to {MAX_PRIORITY}, higher runs first.")


def declared_queues() -> set[str]:
    """The queues the project declares: those of ``DELAYQ["QUEUES"]``, the default
    queue and the queues of registered tasks."""
    return {*conf.QUEUES, conf.DEFAULT_QUEUE, *registry.queues()}


class EnqueueSerializer(serializers.Serializer):
    """Enqueue a job of a registered task."""

    task = serializers.CharField(help_text="Registered task name, e.g. shop.tasks.send_receipt.")
    args = JSONListField(required=False, default=list, initial=list,
                         help_text='Positional arguments, a JSON array: ["a", 2].')
    kwargs = JSONObjectField(required=False, default=dict, initial=dict,
                             help_text='Keyword arguments, a JSON object: {"n": 1}.')
    queue = serializers.CharField(required=False, help_text="Defaults to the task's queue.")
    priority = _priority_field()
    delay = SecondsField(required=False, help_text="Seconds from now (at most 100 years).")
    run_at = StoredDateTimeField(required=False, help_text="ISO 8601 with a UTC offset, "
                                 "from 1970 up to 9998-12-31T00:00Z.")
    job_id = serializers.CharField(required=False,
                                   help_text="Your id for the job: enqueued once per id.")
    max_attempts = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ATTEMPTS)

    def validate_task(self, value: str) -> str:
        if value not in registry:
            raise serializers.ValidationError(f"No task named {value!r} is registered.")
        return value

    def validate_queue(self, value: str) -> str:
        try:
            name = validate_queue_name(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if not conf.API_ANY_QUEUE and name not in declared_queues():
            raise serializers.ValidationError(
                f"No queue named {name!r} is declared: use a queue of DELAYQ['QUEUES'], "
                "DELAYQ['DEFAULT_QUEUE'] or a registered task's queue (DELAYQ"
                "['API_ANY_QUEUE'] = True lets the API enqueue into any queue).")
        return name

    def validate_job_id(self, value: str) -> str:
        try:
            return validate_new_job_id(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        _check_when(attrs, required=False)
        task: Task[Any, Any] = registered(attrs["task"])
        try:
            task.check_arguments(attrs["args"], attrs["kwargs"])
        except TypeError as exc:
            raise serializers.ValidationError({"args": [str(exc)]}) from None
        return attrs


class RescheduleSerializer(serializers.Serializer):
    run_at = StoredDateTimeField(required=False, help_text="ISO 8601 with a UTC offset.")
    delay = SecondsField(required=False, help_text="Seconds from now.")
    priority = _priority_field()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _check_when(attrs, required=True)


class RetrySerializer(serializers.Serializer):
    run_at = StoredDateTimeField(required=False, help_text="When to run again (default: now).")
    delay = SecondsField(required=False, help_text="Seconds from now.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _check_when(attrs, required=False)


class JobFilterSerializer(serializers.Serializer):
    """Query parameters of the job list (all optional, combined with AND)."""

    queue = serializers.CharField(required=False)
    status = serializers.ChoiceField(choices=JobStatus.choices, required=False)
    task = serializers.CharField(required=False, help_text="Exact task name.")
    run_at_after = AwareDateTimeField(required=False, help_text="run_at >= this.")
    run_at_before = AwareDateTimeField(required=False, help_text="run_at < this.")
