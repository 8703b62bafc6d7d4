"""Structured logs, signals and traces (docs/observability.md), through real workers."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from django_delayq import Job, Queue, signals
from django_delayq.connection import get_broker
from django_delayq.engine.logfields import Pairs, log, quote
from django_delayq.engine.workers import live_workers
from django_delayq.runtime import tracing
from tests.conftest import ROOT, wait_until, worker_env, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

FORGED = "bad address\nqueue=fake job=other"


def run_burst(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runworker", "default", "--burst"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def json_records(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


# -- logs ----------------------------------------------------------------------------


def test_a_failed_jobs_record_is_one_json_line_whose_fields_cannot_be_forged(redis_client):
    bad = tasks.raises_value_error.enqueue(FORGED)
    good = tasks.record.enqueue("fine")
    proc = run_burst(worker_env(DJANGO_SETTINGS_MODULE="tests.settings_observed"))
    records = json_records(proc.stderr)
    assert records, proc.stderr
    for line in proc.stderr.splitlines():  # every record of the package is one JSON line
        if "django_delayq" in line:
            assert line.startswith("{"), line
    failed = [r for r in records if r["message"].startswith("job failed")]
    assert len(failed) == 1, proc.stderr
    record = failed[0]
    assert (record["job"], record["queue"], record["task"]) == (
        bad.id, "default", tasks.raises_value_error.name)
    assert (record["attempt"], record["max_attempts"], record["outcome"]) == (1, 1, "failed")
    assert record["level"] == "ERROR"
    assert record["error"] == f"builtins.ValueError: {FORGED}"
    assert isinstance(record["duration_ms"], int)
    assert record["worker"]
    # the text holds the error as one quoted value: no key of it is read as the record's
    assert "\n" not in record["message"]
    assert 'error="builtins.ValueError: bad address\\nqueue=fake job=other"' in \
        record["message"]
    assert not [r for r in records if r.get("job") == "other" or r.get("queue") == "fake"]
    completed = [r for r in records if r["message"].startswith("job completed")]
    assert [(r["job"], r["outcome"], r["attempt"]) for r in completed] == [
        (good.id, "completed", 1)]
    assert "error" not in completed[0]["message"]


@pytest.mark.parametrize(("value", "written"), [
    ("plain-word_1.2:3/x", "plain-word_1.2:3/x"),
    ("two words", '"two words"'),
    ("a\nb", '"a\\nb"'),
    ("k=v", '"k=v"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("", '""'),
    ("line\u2028sep\u0085", '"line\\u2028sep\\u0085"'),
    ("\r", '"\\r"'),
    ("café", '"café"'),
    (3, "3"),
])
def test_each_value_is_a_word_or_a_quoted_string_on_one_line(value, written):
    assert quote(value) == written


def test_a_record_carries_its_fields_as_extra_and_builds_its_text_only_when_shown(caplog):
    logger = logging.getLogger("django_delayq.test")
    with caplog.at_level(logging.INFO, logger="django_delayq.test"):
        log(logger, logging.DEBUG, "not shown", job="j")
        log(logger, logging.WARNING, "job retried", job="j1", attempt=2, max_attempts=5,
            error=None, worker="w")
    (record,) = caplog.records
    assert (record.job, record.attempt, record.max_attempts, record.worker) == (
        "j1", 2, 5, "w")
    assert isinstance(record.args[1], Pairs)
    assert record.getMessage() == "job retried job=j1 attempt=2/5 worker=w"
    assert record.funcName.startswith("test_a_record_carries")  # the caller, not log()


def test_a_field_named_as_a_record_attribute_is_renamed_in_extra(caplog):
    logger = logging.getLogger("django_delayq.test")
    with caplog.at_level(logging.INFO, logger="django_delayq.test"):
        log(logger, logging.ERROR, "job still running", job="j", thread="t-1", name="n")
    (record,) = caplog.records
    assert (record.delayq_thread, record.delayq_name, record.name) == (
        "t-1", "n", "django_delayq.test")
    assert record.getMessage() == "job still running job=j thread=t-1 name=n"


def test_a_field_named_as_an_attribute_of_the_projects_record_factory_is_renamed(caplog):
    """A project's record factory, set after the package loaded, may add attributes of
    its own (``host`` here, a field of the host's records): the record is still written,
    the field given as ``delayq_host``."""
    logger = logging.getLogger("django_delayq.test")
    before = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = before(*args, **kwargs)
        record.host = "machine-1"
        return record

    logging.setLogRecordFactory(factory)
    try:
        with caplog.at_level(logging.INFO, logger="django_delayq.test"):
            log(logger, logging.INFO, "host started", host="h-1", pid=7)
    finally:
        logging.setLogRecordFactory(before)
    (record,) = caplog.records
    assert (record.host, record.delayq_host, record.pid) == ("machine-1", "h-1", 7)
    assert record.getMessage() == "host started host=h-1 pid=7"


def test_names_read_back_from_redis_cannot_forge_a_record_either(redis_client, caplog):
    """A damaged worker record and a bad queue name are read from Redis, where anyone
    with access could have written them: each is logged as one line of its own."""
    broker = get_broker()
    gk = broker.global_keys
    broker.client.zadd(gk.workers, {FORGED: broker.server_time_ms()})
    broker.client.set(gk.worker(FORGED), "not a hash")
    broker.client.sadd(gk.queues, FORGED)
    with caplog.at_level(logging.WARNING, logger="django_delayq"):
        assert live_workers(broker) == []
        assert "fake" not in [q.name for q in Queue.all(broker=broker)]
    worker, = [r for r in caplog.records if r.getMessage().startswith("skipping a damaged")]
    assert worker.worker == FORGED  # the field holds the name as it is
    queue, = [r for r in caplog.records if r.getMessage().startswith("skipping a bad name")]
    assert queue.key == gk.queues
    assert f"worker={json.dumps(FORGED)} " in worker.getMessage()
    for record in (worker, queue):
        text = record.getMessage()
        assert "\n" not in text, text
        # outside its quoted values, the line names no key of the forged text
        assert "=fake" not in re.sub(r'"(?:[^"\\]|\\.)*"', '""', text), text

    assert not [r for r in caplog.records if getattr(r, "queue", None) == "fake"]


LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def writes_a_record(target: ast.expr) -> bool:
    """Whether ``target.<method>(...)`` logs: a logger by a usual name, the ``logging``
    module's own functions, or ``logging.getLogger(...)`` called in place."""
    if isinstance(target, ast.Name):
        return target.id in ("logger", "log", "_log", "LOG", "logging")
    return (isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute)
            and target.func.attr == "getLogger")


def test_every_record_of_the_package_goes_through_the_one_writer():
    """A call such as ``logger.warning("... job=%s", job_id)`` writes its fields into the
    text only: no ``extra``, and a value that can forge a line. Records go through
    ``engine.logfields.log``."""
    package = ROOT / "django_delayq"
    found = {}
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if name == "engine/logfields.py" or "/migrations/" in f"/{name}":
            continue
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS and writes_a_record(node.func.value)):
                found.setdefault(name, []).append(node.lineno)
    assert not found, found



# -- signals -------------------------------------------------------------------------


def test_signals_around_each_attempt_on_a_worker(redis_client):
    seen: list[tuple[str, str, int, str]] = []

    def receiver(name: str) -> Any:
        def on(sender: str, job: Any, worker: str, **kwargs: Any) -> None:
            exception = kwargs.get("exception")
            seen.append((name, job.id, job.attempt,
                         "" if exception is None else type(exception).__name__))
            assert sender == job.task
            assert worker
            if name != "started":
                assert kwargs["outcome"].job is job
        return on

    receivers = {name: receiver(name) for name in ("started", "finished", "retried", "failed")}
    for name, on in receivers.items():
        getattr(signals, f"job_{name}").connect(on)
    try:
        done = tasks.record.enqueue("signals")
        retried = tasks.always_fails.using(max_attempts=2).enqueue("signals")
        coroutine = tasks.async_add.enqueue(1, 2)
        with worker_thread(queues=["default", "async"]):
            wait_until(lambda: all(Job.fetch(j.id, j.queue).is_finished
                                   for j in (done, retried, coroutine)),
                       message="the jobs to finish")
    finally:
        for name, on in receivers.items():
            getattr(signals, f"job_{name}").disconnect(on)
    by_job: dict[str, list[tuple[str, int, str]]] = {}
    for name, job_id, attempt, exception in seen:
        by_job.setdefault(job_id, []).append((name, attempt, exception))
    assert by_job[done.id] == [("started", 1, ""), ("finished", 1, "")]
    assert by_job[coroutine.id] == [("started", 1, ""), ("finished", 1, "")]
    assert by_job[retried.id] == [("started", 1, ""), ("retried", 1, "RuntimeError"),
                                  ("started", 2, ""), ("failed", 2, "RuntimeError")]


def test_the_signal_after_an_aborted_attempt_says_it_failed_for_good(redis_client):
    """A job whose abort was asked ends cancelled, never retried: its signal is
    ``job_failed`` with JobAborted, whether it stopped by itself (it returned) or had
    JobAborted raised in it, never ``job_finished`` or ``job_retried``."""
    seen: dict[str, list[tuple[str, str]]] = {}

    def receiver(name: str) -> Any:
        def on(sender: str, job: Any, worker: str, **kwargs: Any) -> None:
            exception = kwargs.get("exception")
            seen.setdefault(job.id, []).append(
                (name, "" if exception is None else type(exception).__name__))
        return on

    receivers = {name: receiver(name) for name in ("finished", "retried", "failed")}
    for name, on in receivers.items():
        getattr(signals, f"job_{name}").connect(on)
    try:
        coop = tasks.stops_when_aborted.enqueue("signals")
        stubborn = tasks.sleeps.using(max_attempts=3).enqueue(60.0)
        with worker_thread(queues=["default"], concurrency=2, lease=3):
            for job in (coop, stubborn):
                wait_until(lambda job=job: job.refresh().status == "active",
                           message=f"job {job.id} to start")
                assert job.abort(by="alice") is True
            wait_until(lambda: all(j.refresh().status == "cancelled" for j in (coop, stubborn))
                       and len(seen) == 2, message="the aborted jobs to end cancelled")
    finally:
        for name, on in receivers.items():
            getattr(signals, f"job_{name}").disconnect(on)
    assert seen[coop.id] == [("failed", "JobAborted")]
    assert seen[stubborn.id] == [("failed", "JobAborted")]


def test_a_receiver_that_raises_changes_nothing_for_the_job(redis_client, caplog):
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    signals.job_finished.connect(broken)
    try:
        job = tasks.record.enqueue("receiver")
        with worker_thread(queues=["default"]):
            wait_until(lambda: Job.fetch(job.id).is_finished, message="the job to finish")
    finally:
        signals.job_finished.disconnect(broken)
    assert Job.fetch(job.id).status == "completed"
    assert "signal receiver failed" in caplog.text


# -- traces --------------------------------------------------------------------------


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An in-memory exporter of the tracers got during the test (the global provider
    can be set once per process: the other tests keep running untraced)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer", lambda name, *args, **kwargs:
                        provider.get_tracer(name, *args, **kwargs))
    monkeypatch.setattr(tracing, "recording", lambda: True)
    yield exporter
    provider.shutdown()


def test_without_a_provider_no_span_is_made_but_a_trace_upstream_goes_on(redis_client):
    """No tracer provider in this process: the API would hand out no-op spans, so none is
    made, on enqueue or in the worker; a context already current (a traced request
    upstream) still names the trace, through the job and on into what its task sends."""
    assert tracing.ENABLED
    assert not tracing.recording()
    keys = get_broker().keys_for("default", "")
    untraced = [tasks.record.enqueue(f"untraced-{i}") for i in range(100)]
    assert not any(redis_client.hget(keys.job(j.id), "tp") for j in untraced)

    upstream = trace.SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True,
                                 trace_flags=trace.TraceFlags(1))
    with trace.use_span(trace.NonRecordingSpan(upstream)):
        parents = [tasks.sends_record.enqueue(f"traced-{i}") for i in range(100)]
    traceparent = f"00-{0x1234:032x}-{0x5678:016x}-01"
    assert {redis_client.hget(keys.job(j.id), "tp") for j in parents} == {traceparent}
    with worker_thread(queues=["default"], concurrency=4):
        wait_until(lambda: all(Job.fetch(j.id).status == "completed" for j in parents),
                   timeout=60, message="the traced jobs")
    children = [Job.fetch(j.id).result for j in parents]
    assert {redis_client.hget(keys.job(c), "tp") for c in children} == {traceparent}


def test_a_provider_set_later_is_looked_for_once_a_recheck_interval(monkeypatch):
    """While no provider is set, the environment is read at most once per recheck
    interval (not on every enqueue and job); a provider set later is used once it is
    seen, and for good."""
    looks: list[Any] = []
    provider: list[Any] = [trace.ProxyTracerProvider()]

    def get_tracer_provider() -> Any:
        looks.append(provider[0])
        return provider[0]

    monkeypatch.setattr(trace, "get_tracer_provider", get_tracer_provider)
    monkeypatch.setattr(tracing, "_provider", {"set": False, "looked": float("-inf")})
    monkeypatch.setattr(tracing, "PROVIDER_RECHECK_S", 3600.0)  # no stall can pass it
    assert not any(tracing.recording() for _ in range(1000))
    assert len(looks) == 1
    provider[0] = TracerProvider()
    assert not tracing.recording()  # not looked for again yet
    tracing._provider["looked"] -= tracing.PROVIDER_RECHECK_S  # the interval has passed
    assert tracing.recording()
    assert all(tracing.recording() for _ in range(1000))
    assert len(looks) == 2


def consumer_spans(path: Any) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [s for s in map(json.loads, lines) if s["kind"] == "SpanKind.CONSUMER"]


def test_the_enqueue_and_each_attempt_are_spans_of_one_trace(spans, tmp_path, redis_client,
                                                             spawned):
    assert tracing.ENABLED
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /orders/") as request:
        job = tasks.always_fails.using(max_attempts=2).enqueue("traced")
    (enqueue,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert enqueue.name == "send default"
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert dict(enqueue.attributes) == {
        "messaging.system": "django_delayq", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "default",
        "messaging.message.id": job.id, "delayq.task": tasks.always_fails.name}
    trace_id = enqueue.context.trace_id
    stored = redis_client.hget(get_broker().keys_for("default", job.id).job(job.id), "tp")
    assert stored.startswith(f"00-{trace_id:032x}-{enqueue.context.span_id:016x}-")

    written = tmp_path / "spans.jsonl"
    spawned("default", env={"DJANGO_SETTINGS_MODULE": "tests.settings_observed",
                            "DELAYQ_TEST_SPANS": str(written)})
    wait_until(lambda: len(consumer_spans(written)) == 2, timeout=60,
               message="both attempts' spans")
    attempts = consumer_spans(written)
    assert [s["attributes"]["delayq.attempt"] for s in attempts] == [1, 2]
    for span in attempts:
        assert span["name"] == "process default"
        assert int(span["context"]["trace_id"], 16) == trace_id  # the request's trace
        assert int(span["parent_id"], 16) == enqueue.context.span_id
        assert span["attributes"]["messaging.message.id"] == job.id
        assert span["attributes"]["messaging.operation.type"] == "process"
        assert span["status"]["status_code"] == "ERROR"
        assert span["events"][0]["name"] == "exception"
    assert [s["attributes"]["delayq.outcome"] for s in attempts] == ["retried", "failed"]
