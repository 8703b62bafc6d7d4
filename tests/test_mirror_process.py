"""A single ``runworker``'s mirror process: started beside the worker, restarted when it
dies, stopped after the worker's last acks, gone with its worker, off without a table."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import (
    ROOT,
    OutputReader,
    first_line,
    kill_with_children,
    migrated_sqlite,
    pid_alive,
    sqlite_rows,
    stop_during_a_job,
    wait_until,
    worker_env,
)
from tests.testapp import tasks


def test_the_mirror_runs_in_a_process_of_its_own_restarted_and_stopped_last(
        redis_client, spawned, tmp_path):
    db = migrated_sqlite(tmp_path)
    first = tasks.record.enqueue("first")
    proc, out = spawned("default", "-c", "2", env={"DELAYQ_TEST_SQLITE": db})
    mirror = int(out.wait_for("started mirror-0 pid=", timeout=60).split("pid=")[1].split()[0])
    assert mirror != proc.pid
    wait_until(lambda: sqlite_rows(db).get(first.id) == "completed", timeout=60,
               message=f"the first row:\n{out.text}")
    # a mirror that dies is started again (after a backoff: it died young)
    os.kill(mirror, signal.SIGKILL)
    out.wait_for(f"mirror-0 died pid={mirror} code=-9")
    wait_until(lambda: out.text.count("started mirror-0 pid=") == 2, timeout=60,
               message=f"the mirror's restart:\n{out.text}")
    second = tasks.record.enqueue("second")
    last = tasks.gated.enqueue("last", gate="gate:last")
    wait_until(lambda: sqlite_rows(db).get(second.id) == "completed"
               and sqlite_rows(db).get(last.id) == "active", timeout=60,
               message=f"rows after the restart:\n{out.text}")
    # stopped after the worker's last acks, it mirrors them before it exits
    lines = stop_during_a_job(proc, out, redis_client, stopping="worker stopping",
                              gate="gate:last")
    assert sqlite_rows(db)[last.id] == "completed"
    assert first_line(lines, "mirror-0 stopped") > first_line(lines, "worker stopped"), out.text
    assert not any(pid_alive(int(x.split("pid=")[1].split()[0]))
                   for x in lines if "started mirror-0 pid=" in x)


def test_the_mirror_process_stops_when_its_worker_is_killed(redis_client, spawned, tmp_path):
    db = migrated_sqlite(tmp_path)
    job = tasks.record.enqueue("before")
    proc, out = spawned("default", "-c", "1", env={"DELAYQ_TEST_SQLITE": db})
    mirror = int(out.wait_for("started mirror-0 pid=", timeout=60).split("pid=")[1].split()[0])
    wait_until(lambda: sqlite_rows(db).get(job.id) == "completed", timeout=60,
               message=f"a row:\n{out.text}")
    proc.kill()
    proc.wait()
    wait_until(lambda: not pid_alive(mirror), timeout=30,
               message="the orphaned mirror to stop by itself")


def test_the_mirror_is_not_started_without_its_table(redis_client, spawned):
    job = tasks.record.enqueue("no-table")
    proc, out = spawned("default", "--burst")
    assert proc.wait(timeout=60) == 0, out.text
    assert job.refresh().status == "completed"
    assert "the mirror is off: the Job table is missing" in out.text
    assert "started mirror-0" not in out.text


@pytest.mark.parametrize(("stop", "drains"), [("eof", True), ("signal", False)])
def test_a_mirror_child_drains_after_its_stdin_ends_never_after_a_signal(tmp_path, stop,
                                                                        drains):
    """Its parent stops it warmly by closing its stdin (it then mirrors what is left,
    at most 5 s); a signal to it is the parent's cold stop: it exits without draining."""
    db = migrated_sqlite(tmp_path)
    tasks.record.enqueue("an event")
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "delayq_mirror", "--drain-on-stop", "--stop-on-eof",
         "-v", "1"], cwd=ROOT, env=worker_env(DELAYQ_TEST_SQLITE=db), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = OutputReader(proc)
    try:
        out.wait_for("mirror started consumer=", timeout=60)
        if stop == "eof":
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_with_children(proc)
    assert code == 0, out.text
    assert ("burst=True" in out.text) == drains, out.text


def test_other_mirrors_leave_a_stopping_worker_s_mirror_alone_while_it_drains(
        redis_client, broker, spawned, tmp_path):
    """The worker's record stays until its mirror process has stopped: until then its
    consumer (<worker>/mirror) is not taken for gone, so no other mirror takes over the
    events it is still writing."""
    from django_delayq.engine.workers import consumers_gone, mirror_consumer

    db = migrated_sqlite(tmp_path)
    first = tasks.record.enqueue("first")
    proc, out = spawned("default", "-c", "1", "--name", "draining",
                        env={"DELAYQ_TEST_SQLITE": db})
    wait_until(lambda: sqlite_rows(db).get(first.id) == "completed", timeout=60,
               message=f"the mirror up:\n{out.text}")
    # Hold the database, so the mirror's drain is still writing when the test looks.
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as lock:
        lock.execute("BEGIN EXCLUSIVE")
        second = tasks.record.enqueue("second")
        wait_until(lambda: second.refresh().status == "completed", timeout=60,
                   message="the second job")
        proc.send_signal(signal.SIGTERM)
        out.wait_for("burst=True", timeout=60)  # the drain began
        assert consumers_gone(broker, [mirror_consumer("draining")]) == set(), out.text
        lock.execute("ROLLBACK")
    assert proc.wait(timeout=60) == 0, out.text
    assert sqlite_rows(db)[second.id] == "completed"
    assert consumers_gone(broker, [mirror_consumer("draining")]) == {"draining/mirror"}
