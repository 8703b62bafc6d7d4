"""A single ``runworker``'s mirror process: started beside the worker, restarted when it
dies, stopped after the worker's last acks, gone with its worker, off without a table."""

from __future__ import annotations

import os
import signal

from tests.conftest import (
    first_line,
    migrated_sqlite,
    pid_alive,
    sqlite_rows,
    stop_during_a_job,
    wait_until,
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
