"""The job-history lake: events exported to Parquet once each, whatever crashes between a
file and its acknowledgement, and read back by Spark per attempt and per job."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyarrow import fs as pafs

from django_delayq.engine.keys import QueueKeys
from django_delayq.lake import GROUP, Exporter
from django_delayq.lake.store import read_all
from django_delayq.mirror import GROUP as MIRROR_GROUP
from django_delayq.runtime.consumer import stream_id
from tests.conftest import ROOT, migrated_sqlite, wait_until, worker_env, worker_thread
from tests.lake_events import Crash, CrashBeforeAck, generate
from tests.testapp import tasks

KEYS = QueueKeys("dq", "default")
#: The jobs of the exported-twice test: enough for a crash mid-export (its 4th batch of
#: 60 entries, of about 400) and percentiles over many chunks. The export's rate and
#: Spark's read at a million jobs are bench/lake.py's (make bench; docs/spark.md).
JOBS = 100_000
UTC = dt.UTC


def export(lake: Path | str, broker: Any, **kwargs: Any) -> Exporter:
    exporter = Exporter(str(lake), broker=broker, block=0.1, **kwargs)
    exporter.run(burst=True)
    return exporter


def stream_events(client: Any, keys: QueueKeys = KEYS) -> Counter[tuple[str, str, str]]:
    """Every (entry id, event, job) the stream holds."""
    found: Counter[tuple[str, str, str]] = Counter()
    for entry_id, fields in client.xrange(keys.events):
        jobs = fields["jobs"].split(" ") if "jobs" in fields else [fields["job"]]
        for job in jobs:
            found[(entry_id, fields["event"], job)] += 1
    return found


def lake_events(lake: Path | str) -> Counter[tuple[str, str, str]]:
    table = read_all(str(lake))
    return Counter(zip(table.column("stream_id").to_pylist(), table.column("event").to_pylist(),
                       table.column("job_id").to_pylist(), strict=True))


def pending(client: Any, group: str = GROUP) -> int:
    return int(client.xpending(KEYS.events, group)["pending"])


def ran_jobs() -> list[Any]:
    done = [tasks.record.using(priority=3).enqueue(f"a{i}") for i in range(5)]
    late = [tasks.record.using(delay=0.3).enqueue(f"l{i}") for i in range(3)]
    failed = tasks.always_fails.enqueue("f")
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(j.refresh().status == "completed" for j in done + late)
                   and failed.refresh().status == "failed", message="jobs to finish")
    return [*done, *late, failed]


def test_the_start_record_names_the_lake_as_one_quoted_field(tmp_path, broker, caplog):
    """A lake's path is the operator's to choose (a space, an ``=``): it is one field of
    the record, in its ``extra`` too, and cannot add a key to the line."""
    lake = tmp_path / "job history x=1"
    lake.mkdir()
    with caplog.at_level(logging.INFO, logger="django_delayq.mirror"):
        export(lake, broker)
    started, = [r for r in caplog.records if r.getMessage().startswith("lake export started")]
    assert started.lake == str(lake)
    assert started.getMessage().startswith(f"lake export started lake={json.dumps(str(lake))} ")


def test_export_writes_each_event_once_in_its_own_group(tmp_path, broker, redis_client):
    jobs = ran_jobs()
    exporter = export(tmp_path, broker)
    expected = stream_events(redis_client)
    assert lake_events(tmp_path) == expected
    assert exporter.rows == sum(expected.values())
    assert exporter.lost == 0
    assert pending(redis_client) == 0
    # The mirror's group is another one: the export neither created nor moved it.
    groups = {g["name"]: g for g in redis_client.xinfo_groups(KEYS.events)}
    assert set(groups) == {GROUP}
    day = dt.datetime.now(UTC).strftime("%Y-%m-%d")
    files = sorted(p.name for p in (tmp_path / f"date={day}").iterdir())
    assert files
    assert all(f.startswith("default~x~") and f.endswith(".parquet") for f in files)
    table = read_all(str(tmp_path))
    rows = table.to_pylist()
    enq = {r["job_id"]: r for r in rows if r["event"] == "enqueued"}
    assert enq[jobs[0].id]["task_name"] == tasks.record.name
    assert enq[jobs[0].id]["priority"] == 3
    assert enq[jobs[5].id]["run_at"] == jobs[5].run_at
    ends = [r for r in rows if r["job_id"] == jobs[-1].id and r["event"] in ("retried", "failed")]
    assert [(r["event"], r["attempt"]) for r in ends] == [
        ("retried", 1), ("retried", 2), ("failed", 3)]
    assert all(r["started_at"] is not None for r in ends)
    # Nothing new: a second run writes nothing.
    again = export(tmp_path, broker)
    assert (again.entries, again.files) == (0, 0)
    assert lake_events(tmp_path) == expected


def test_queues_named_like_hidden_files_are_read_back_and_written_once(tmp_path, broker,
                                                                       redis_client):
    """Readers skip files whose names begin with ``_`` or ``.``, as queue names may."""
    shards = [QueueKeys("dq", queue) for queue in ("_private", ".dot", "plain")]
    for keys in shards:
        for i in range(40):
            broker.enqueue(keys.queue, "t.x", [i])
    expected = sum((stream_events(redis_client, keys) for keys in shards), Counter())
    crashing = CrashBeforeAck(str(tmp_path), broker=broker, batch_size=10, after=5,
                              name="first")
    with pytest.raises(Crash):
        crashing.run(burst=True)
    export(tmp_path, broker, batch_size=7, name="first")  # the files written are found
    assert lake_events(tmp_path) == expected
    table = read_all(str(tmp_path))
    assert Counter(table.column("queue").to_pylist()) == {
        "_private": 40, ".dot": 40, "plain": 40}


def test_the_mirror_and_the_export_ack_apart(tmp_path, broker, redis_client):
    from django_delayq.mirror import Mirror

    ran_jobs()
    exporter = export(tmp_path, broker)
    assert exporter.entries == redis_client.xlen(KEYS.events)
    # The mirror then reads the whole stream through its own group, from the start.
    redis_client.xgroup_create(KEYS.events, MIRROR_GROUP, id="0")
    mirror = Mirror(block=0.1, queues=["default"], broker=broker)
    assert mirror.drain(timeout=30) == redis_client.xlen(KEYS.events)
    assert pending(redis_client) == 0
    assert pending(redis_client, MIRROR_GROUP) == 0


@pytest.mark.parametrize("second", [{"name": "first", "batch_size": 7},
                                    {"name": "other", "claim_idle": 0}])
def test_a_crash_between_file_and_ack_writes_nothing_twice(tmp_path, broker, redis_client,
                                                            second):
    tasks.record.enqueue_many([f"x{i}"] for i in range(2_500))
    for i in range(40):
        tasks.record.enqueue(f"one-{i}")
    expected = stream_events(redis_client)
    crashing = CrashBeforeAck(str(tmp_path), broker=broker, batch_size=10, after=3,
                              name="first")
    with pytest.raises(Crash):
        crashing.run(burst=True)
    assert crashing.files == 3
    assert pending(redis_client) == 10
    written = lake_events(tmp_path)
    assert sum(written.values()) > 0
    # Run again, with other batch boundaries (or as another consumer): the entries of the
    # file already written are acknowledged, not written again.
    export(tmp_path, broker, **second)
    assert lake_events(tmp_path) == expected
    assert pending(redis_client) == 0


def test_a_batch_taken_over_from_a_slow_exporter_is_written_once(tmp_path, broker,
                                                                  redis_client):
    """Exporter A reads a batch and stalls before its file; B takes the batch over (its
    entries idle past B's claim_idle), exports everything and acknowledges; then A
    wakes and writes its file. B took A's batch whole, so both wrote the same file."""
    tasks.record.enqueue_many([f"x{i}"] for i in range(300))
    for i in range(30):
        tasks.record.enqueue(f"one-{i}")
    expected = stream_events(redis_client)
    writing, resume = threading.Event(), threading.Event()

    class Stalled(Exporter):
        def _write(self, keys: QueueKeys, day: str, part: Any) -> None:
            writing.set()
            assert resume.wait(30)
            super()._write(keys, day, part)

    slow = Stalled(str(tmp_path), broker=broker, name="slow", batch_size=20)
    thread = threading.Thread(target=slow.step)
    thread.start()
    try:
        assert writing.wait(30)
        other = export(tmp_path, broker, name="other", batch_size=7, claim_idle=0)
        assert lake_events(tmp_path) == expected
        assert other.entries == redis_client.xlen(KEYS.events)
    finally:
        resume.set()
        thread.join(30)
    assert slow.files == 1
    assert lake_events(tmp_path) == expected  # A's file replaced B's: the same name
    assert pending(redis_client) == 0
    assert redis_client.hlen(KEYS.batches(GROUP)) == 0


def test_entries_delivered_again_after_a_failover_are_written_once(tmp_path, broker,
                                                                   redis_client, monkeypatch):
    """A Sentinel failover promotes a replica that may lack the last reads and
    acknowledgements of the lake's group (replication is asynchronous): entries already
    in files and acknowledged come again, pending and as new, in other batches. Here on
    one Redis: after a whole export the group is set back (XGROUP SETID), as such a
    replica has it, and some entries read again as pending to the last exporter. Only
    the files whose names' ranges overlap what comes again are opened."""
    from django_delayq.lake import store

    tasks.record.enqueue_many([f"x{i}"] for i in range(300))
    for i in range(60):
        tasks.record.enqueue(f"one-{i}")
    opened: list[str] = []
    stream_ids_in = store.stream_ids_in

    def counted(filesystem: Any, path: str) -> set[str]:
        opened.append(path)
        return stream_ids_in(filesystem, path)

    monkeypatch.setattr(store, "stream_ids_in", counted)
    first = export(tmp_path, broker, batch_size=10, name="before")
    assert first.entries == redis_client.xlen(KEYS.events)
    assert opened == []  # nothing delivered twice: no file read
    ids = [entry_id for entry_id, _ in redis_client.xrange(KEYS.events)]
    redis_client.xgroup_setid(KEYS.events, GROUP, ids[19])
    redis_client.xreadgroup(GROUP, "before", {KEYS.events: ">"}, count=9)
    assert pending(redis_client) == 9
    for i in range(5):
        tasks.record.enqueue(f"after-{i}")  # new since: written
    expected = stream_events(redis_client)
    again = export(tmp_path, broker, batch_size=7, name="before")
    assert lake_events(tmp_path) == expected
    assert again.entries == len(ids) - 20 + 5
    assert again.rows == 5
    assert pending(redis_client) == 0
    # what came again: the files whose last id is the 21st's or later, and only them
    overlapping = {p for p in tmp_path.glob("date=*/*.parquet")
                   if stream_id(p.stem.split("~")[3]) >= stream_id(ids[20])}
    assert opened
    assert {Path(p) for p in opened} <= overlapping


def test_the_exporters_of_workers_on_one_host_are_consumers_of_their_own(
        tmp_path, broker, redis_client, settings, monkeypatch):
    """Each runworker runs an export on a thread (LAKE_PATH): named after its worker, as
    its mirror is, so two on one host never take each other's batch in progress for
    their own. A stopped worker's batch, left pending, is taken over at once by another
    (its worker is gone); side by side, with other batch boundaries, the lake holds each
    event once."""
    from django_delayq.engine.workers import forget, new_worker_name, record_alive
    from django_delayq.services import host_services

    settings.DELAYQ = {**settings.DELAYQ, "LAKE_PATH": str(tmp_path)}
    workers = [new_worker_name() for _ in range(3)]
    stopped, *running = (host_services(w, mirror=False, relay=False)[0].consumer
                         for w in workers)
    assert [e.name for e in (stopped, *running)] == [f"{w}/lake" for w in workers]
    tasks.record.enqueue_many([f"x{i}"] for i in range(300))
    for i in range(60):
        tasks.record.enqueue(f"one-{i}")
    expected = stream_events(redis_client)
    for worker in workers:
        record_alive(broker, worker, 60, {"role": "supervisor"})
    acks = iter(range(3))
    acknowledge = stopped._acknowledge

    def crash_on_the_third(keys: QueueKeys, batch: Any) -> None:
        if next(acks) == 2:
            raise Crash
        acknowledge(keys, batch)

    monkeypatch.setattr(stopped, "_acknowledge", crash_on_the_third)
    stopped.batch_size = 10
    with pytest.raises(Crash):
        stopped.run(burst=True)
    assert pending(redis_client) == 10
    forget(broker, workers[0])
    for exporter, size in zip(running, (7, 11), strict=True):
        exporter.batch_size = size
    threads = [threading.Thread(target=e.run, kwargs={"burst": True}) for e in running]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert lake_events(tmp_path) == expected
    assert pending(redis_client) == 0
    assert sum(e.entries for e in running) == redis_client.xlen(KEYS.events) - 20


def test_a_killed_export_process_rerun_leaves_no_duplicate(tmp_path, redis_client):
    for n in range(20):
        tasks.record.enqueue_many([f"{n}-{i}"] for i in range(1_000))
    expected = stream_events(redis_client)
    command = [sys.executable, "-m", "django", "delayq_export", str(tmp_path), "--burst",
               "--batch-size", "1"]
    proc = subprocess.Popen(command, cwd=ROOT, env=worker_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)  # killed below: nothing reads it
    try:
        wait_until(lambda: len(list(tmp_path.glob("date=*/*.parquet"))) >= 2 or
                   proc.poll() is not None, timeout=60, message="the first files")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert sum(lake_events(tmp_path).values()) < sum(expected.values())
    done = subprocess.run(command, cwd=ROOT, env=worker_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert lake_events(tmp_path) == expected
    assert pending(redis_client) == 0


@pytest.mark.parametrize("args", [(), ("--no-mirror",)])
def test_runworker_exports_on_a_thread_when_lake_path_is_set(tmp_path, redis_client, args):
    """On a thread of runworker's host, with or without the mirror."""
    db = migrated_sqlite(tmp_path)
    lake = tmp_path / "lake"
    jobs = [tasks.record.enqueue(f"w{i}") for i in range(5)]
    env = worker_env(DELAYQ_TEST_SETTINGS=json.dumps({"LAKE_PATH": str(lake)}),
                     DELAYQ_TEST_SQLITE=db)
    done = subprocess.run([sys.executable, "-m", "django", "runworker", "--burst", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    exporters = [line for line in done.stderr.splitlines()
                 if "lake export started" in line and "burst=False" in line]
    assert len(exporters) == 1, done.stderr
    assert ("mirror started consumer=" in done.stderr) == (not args), done.stderr
    assert all(j.refresh().status == "completed" for j in jobs)
    # Stopping, the thread exported what the worker's last acks wrote.
    assert lake_events(lake) == stream_events(redis_client)
    assert {e for _, e, _ in lake_events(lake)} >= {"enqueued", "completed"}


def test_trimmed_events_are_counted_as_lost(tmp_path, broker, redis_client):
    for i in range(5):
        tasks.record.enqueue(f"before-{i}")
    redis_client.xtrim(KEYS.events, maxlen=2, approximate=False)
    # Trimmed before the lake began: not lost to it.
    assert (export(tmp_path, broker).lost, export(tmp_path, broker).rows) == (0, 0)
    assert sum(lake_events(tmp_path).values()) == 2
    for i in range(30):
        tasks.record.enqueue(f"t{i}")
    redis_client.xtrim(KEYS.events, maxlen=10, approximate=False)
    exporter = export(tmp_path, broker)
    assert (exporter.lost, exporter.rows) == (20, 10)


def test_an_entry_the_lake_cannot_hold_is_skipped_and_shown(tmp_path, broker, redis_client):
    """Hand-written entries with a time or an attempt no column can hold, a job id no job
    can have, a newer format, an entry id past year 9999 with no time of its own: each is
    left out, counted where the mirror's skips are, and logged; the rest is exported."""
    from django_delayq import Queue

    tasks.record.enqueue("before")
    bad = [redis_client.xadd(KEYS.events, fields) for fields in (
        {"event": "completed", "job": "x", "ts": "1e40"},
        {"event": "completed", "job": "y", "ts": str(10**20)},
        {"event": "started", "job": "z", "ts": "1767614400000", "attempt": str(2**40)},
        {"event": "started", "jobs": "a b", "attempts": "1", "ts": "1767614400000"},
        # what the mirror skips too, through the one decoder
        {"event": "completed", "job": "no spaces allowed", "ts": "1767614400000"},
        {"event": "completed", "job": "w", "ts": "1767614400000", "fv": "2"},
    )]
    tasks.record.enqueue("after")
    # an entry id past year 9999 (a clock far off), and so every later one: dated by
    # their events' times; without a time, left out
    bad.append(redis_client.xadd(KEYS.events, {"event": "completed", "job": "v", "ts": ""},
                                 id="300000000000000-0"))
    tasks.record.enqueue("on a clock far off")
    expected = Counter({k: n for k, n in stream_events(redis_client).items()
                        if k[0] not in bad})
    exporter = export(tmp_path, broker)
    assert exporter.skipped == len(bad)
    assert lake_events(tmp_path) == expected
    assert pending(redis_client) == 0
    count, reasons = Queue("default").skipped_events()
    assert count == len(bad)
    assert sorted(r.split(" id=")[1].split(" ")[0] for r in reasons) == sorted(bad)
    assert all(" lake export id=" in r and "garbled event" in r for r in reasons)


@pytest.fixture
def s3_lake(tmp_path: Path) -> Iterator[str]:
    """A lake URL on a local S3 endpoint: moto's server (``moto[server]``, in
    requirements-dev.txt), started on a free port, with a bucket PyArrow creates."""
    from tests.servers import quiet_port

    port = quiet_port()  # bound later, by another process
    log = tmp_path / "moto.log"  # a file: an unread pipe fills with a line per request
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                 "-p", str(port)], stdout=subprocess.DEVNULL, stderr=sink)
    try:
        def up() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_until(lambda: proc.poll() is not None or up(), timeout=60,
                   message="moto's S3 server")
        if proc.poll() is not None:
            pytest.fail("moto's S3 server did not start (pip install -r requirements-dev.txt): "
                        + log.read_text()[-2000:])
        yield (f"s3://testing:s3-secret-value@delayq-lake/lake?region=us-east-1"
               f"&endpoint_override=127.0.0.1:{port}&scheme=http&allow_bucket_creation=true")
    finally:
        proc.terminate()
        proc.wait()


def test_the_lake_on_a_local_s3_endpoint(s3_lake, broker, redis_client, caplog):
    """Written through the URL branch of the store (an object store: no rename), with a
    crash between a file and its acknowledgement, read back whole; the URL's secret
    never shows in a log or an error."""
    from django_delayq.lake.store import open_lake
    from django_delayq.spark.lake import is_lake

    tasks.record.enqueue_many([f"x{i}"] for i in range(1_500))
    for i in range(20):
        tasks.record.enqueue(f"one-{i}")
    expected = stream_events(redis_client)
    crashing = CrashBeforeAck(s3_lake, broker=broker, batch_size=5, after=3, name="first")
    with pytest.raises(Crash):
        crashing.run(burst=True)
    export(s3_lake, broker, batch_size=3, name="first")
    assert pending(redis_client) == 0
    assert lake_events(s3_lake) == expected
    filesystem, root = open_lake(s3_lake)
    names = [i.base_name for i in filesystem.get_file_info(
        pafs.FileSelector(root, recursive=True)) if i.is_file]
    assert names
    assert all(n.startswith("default~x~") and n.endswith(".parquet") for n in names)
    assert is_lake(s3_lake)
    assert not is_lake(s3_lake.replace("/lake?", "/jobs.parquet?"))
    assert "s3-secret-value" not in caplog.text
    assert 'lake export started lake="s3://testing:***@delayq-lake/lake?' in caplog.text
    with pytest.raises(ValueError, match="cannot open the lake") as refused:
        open_lake(s3_lake.replace("scheme=http", "scheme=gopher"))
    assert "s3-secret-value" not in str(refused.value)


def test_export_command_needs_a_lake(capsys):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="LAKE_PATH"):
        call_command("delayq_export", "--burst")
    with pytest.raises(CommandError, match="batch-size"):
        call_command("delayq_export", "/tmp/lake", "--batch-size", "0")


# -- Spark -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from django_delayq.spark import SparkSetupError, spark_session

    try:
        session = spark_session("local[2]", app_name="delayq-lake-tests", config={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1500m",
            "spark.sql.session.timeZone": "UTC",
        })
    except SparkSetupError as exc:
        pytest.fail(f"Spark cannot start, so the lake tests cannot run: {exc}")
    yield session
    session.stop()


@pytest.mark.spark
@pytest.mark.django_db
def test_the_lake_report_equals_the_table_report(tmp_path, broker, spark):
    from django.core.management import call_command

    from django_delayq.mirror import Mirror
    from django_delayq.spark import attempts_from_lake, build_report, jobs_from_orm
    from django_delayq.spark.render import format_table, write_report

    jobs = ran_jobs()
    failed = jobs[-1]
    # Jobs that have not run: one waiting for its parent, one released at enqueue by its
    # finished parent (its entries say waiting, then ready), one claimed by a worker
    # that has not started it.
    parent = tasks.record.using(delay=600).enqueue("parent")
    waiting = tasks.record.using(depends_on=[parent]).enqueue("waits")
    released = tasks.record.using(depends_on=[jobs[0]]).enqueue("released")
    claimed = tasks.record_other.enqueue("claimed")
    (claim,) = broker.claim("other", 1, "tester")
    assert [c.id for c in claim.jobs] == [claimed.id]
    jobs += [parent, waiting, released, claimed]
    Mirror(block=0.1, broker=broker).run(burst=True)
    lake = tmp_path / "lake"
    export(lake, broker)
    from_table = build_report(jobs_from_orm(spark), top=5)
    assert from_table.jobs == len(jobs)
    default, other = from_table.row("default"), from_table.row("other")
    assert (default["waiting"], default["scheduled"], default["ready"]) == (1, 1, 1)
    assert (other["claimed"], other["total"]) == (1, 1)
    write_report(from_table, tmp_path / "table")
    # delayq_report takes the lake for --input: the same table, the same CSVs (summary,
    # timeline and worst offenders, every value written out).
    out = io.StringIO()
    call_command("delayq_report", "--input", str(lake), "--top", "5",
                 "--out", str(tmp_path / "from-lake"), stdout=out)
    assert out.getvalue().startswith(format_table(from_table))
    for name in ("summary.csv", "timeline.csv", "latest.csv", "longest.csv"):
        table_csv = (tmp_path / "table" / name).read_text()
        assert (tmp_path / "from-lake" / name).read_text() == table_csv, name
    failing = {r["attempt"]: r for r in attempts_from_lake(spark, str(lake))
               .where(f"job_id = '{failed.id}'").collect()}
    assert [failing[n]["outcome"] for n in (1, 2, 3)] == ["retried", "retried", "failed"]
    assert all(failing[n]["duration"] >= 0 and failing[n]["worker"] for n in (1, 2, 3))
    assert failing[2]["run_at"] > failing[1]["finished_at"]


@pytest.mark.spark
@pytest.mark.django_db
def test_the_lake_and_an_export_through_file_urls(tmp_path, broker, redis_client, spark):
    """``delayq_export`` and ``delayq_report --input`` take URLs: a lake by its URL is
    read as a lake, an exported file by its URL as a file."""
    from django.core.management import call_command

    from django_delayq.mirror import Mirror
    from django_delayq.spark import export_jobs
    from django_delayq.spark.lake import is_lake

    ran_jobs()
    Mirror(block=0.1, broker=broker).run(burst=True)
    url = (tmp_path / "lake").as_uri()
    assert url.startswith("file:///")
    export(url, broker)
    assert lake_events(url) == stream_events(redis_client)
    assert is_lake(url)
    call_command("delayq_report", "--input", url, "--out", str(tmp_path / "from-lake"),
                 stdout=io.StringIO())
    export_jobs(tmp_path / "jobs.parquet")
    file_url = (tmp_path / "jobs.parquet").as_uri()
    assert not is_lake(file_url)
    call_command("delayq_report", "--input", file_url, "--out", str(tmp_path / "from-file"),
                 stdout=io.StringIO())
    for name in ("summary.csv", "timeline.csv", "latest.csv", "longest.csv"):
        assert ((tmp_path / "from-lake" / name).read_text()
                == (tmp_path / "from-file" / name).read_text()), name


@pytest.mark.spark
@pytest.mark.slow
def test_many_jobs_exported_twice_read_back_exactly(tmp_path, broker, redis_client, spark):
    """100,000 jobs' events (400,000 rows): an export that dies before an ack, then
    another with other batch boundaries; Spark reads each event once, and every job's
    attempt with its exact lateness and duration percentiles. (With this module's other
    Spark tests: one SparkSession.)"""
    from pyspark.sql import functions as F

    from django_delayq.spark import attempts_from_lake
    from django_delayq.spark.lake import lake_events as read_lake

    t0 = dt.datetime(2026, 1, 5, 12, tzinfo=UTC)
    made = generate(broker, tasks.record.name, KEYS, JOBS, t0=t0)
    # One process plays both runs: the second takes the batch back by its name (a
    # process of its own would take it over, the first one's process having ended).
    crashing = CrashBeforeAck(str(tmp_path), broker=broker, batch_size=60, after=4,
                              name="first")
    with pytest.raises(Crash):
        crashing.run(burst=True)
    export(tmp_path, broker, batch_size=25, name="first")
    again = export(tmp_path, broker)  # nothing new: nothing written
    assert (again.entries, again.files, pending(redis_client)) == (0, 0, 0)
    events = read_lake(spark, str(tmp_path))
    assert events.count() == made.events
    assert events.select("stream_id", "job_id").distinct().count() == made.events
    attempts = attempts_from_lake(spark, str(tmp_path))
    stats = attempts.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when(F.col("outcome") == "completed", 1).otherwise(0)).alias("done"),
        F.expr("percentile(lateness, array(0.5, 0.95, 0.99))").alias("late"),
        F.expr("percentile(duration, array(0.5, 0.95, 0.99))").alias("dur"),
    ).first()
    assert (stats["n"], stats["done"]) == (made.jobs, made.jobs)
    for got, values in ((stats["late"], made.lateness), (stats["dur"], made.duration)):
        want = np.percentile(np.array(values), [50, 95, 99], method="linear")
        assert got == pytest.approx(list(want), rel=1e-12, abs=1e-9)
