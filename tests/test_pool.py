"""``runworker --processes N``: the host, its worker processes, restarts, signals,
recycling."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
from django.urls import reverse

from django_delayq import Queue
from django_delayq.connection import get_broker
from django_delayq.engine import EnqueueRequest, QueueKeys
from django_delayq.runtime.children import (
    FIRST_RESTART_DELAY,
    MAX_RESTART_DELAY,
    QUICK_DEATH,
    project_paths,
    restart_delay,
)
from django_delayq.runtime.worker.recycle import MEMORY_CHECK_INTERVAL
from tests.conftest import (
    OutputReader,
    first_line,
    kill_with_children,
    migrated_sqlite,
    pid_alive,
    ran,
    sqlite_rows,
    stop_during_a_job,
    wait_until,
    worker_env,
)
from tests.testapp import tasks


def registry(client: Any) -> list[dict[str, str]]:
    """Every record of the workers registry (supervisors and workers)."""
    names = client.zrange("dq:workers", 0, -1)
    return [r for r in (client.hgetall(f"dq:worker:{n}") for n in names) if r]


def children_of(client: Any, supervisor_pid: int) -> list[dict[str, str]]:
    supervisors = {r["name"] for r in registry(client)
                   if r.get("role") == "supervisor" and r["pid"] == str(supervisor_pid)}
    return [r for r in registry(client) if r.get("supervisor") in supervisors]


def starts(client: Any, kind: str) -> list[dict[str, Any]]:
    return [r for r in ran(client) if r["task"] == kind]


def test_restart_delay_backs_off_for_quick_deaths_only():
    assert restart_delay(QUICK_DEATH + 1, 0) == 0.0
    assert restart_delay(QUICK_DEATH + 1, 5) == 0.0
    delays = [restart_delay(0.5, n) for n in range(1, 10)]
    assert delays[0] == FIRST_RESTART_DELAY
    assert delays == sorted(delays)
    assert delays[1] == 2 * delays[0]
    assert delays[-1] == MAX_RESTART_DELAY


def test_cpu_bound_jobs_run_in_two_processes_at_once(redis_client, spawned):
    jobs = [tasks.spin.enqueue(f"s{i}", gate="gate:spin") for i in range(2)]
    proc, out = spawned("default", "--processes", "2", "-c", "1", "--prefetch", "0")
    # one thread per process, and neither job ends before the gate opens: two starts
    # mean two processes computing at the same time
    wait_until(lambda: len(starts(redis_client, "spin-start")) == 2, timeout=60,
               message=f"both CPU-bound jobs to start:\n{out.text}")
    pids = {r["pid"] for r in starts(redis_client, "spin-start")}
    assert len(pids) == 2
    assert proc.pid not in pids
    records = registry(redis_client)
    supervisor = next(r for r in records if r.get("role") == "supervisor")
    assert supervisor["pid"] == str(proc.pid)
    children = children_of(redis_client, proc.pid)
    assert {int(r["pid"]) for r in children} >= pids
    assert all(r["role"] == "worker" for r in children)
    redis_client.set("gate:spin", 1)
    for job in jobs:
        wait_until(lambda job=job: job.refresh().status == "completed",
                   message="CPU-bound job to complete")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text
    assert "host stopped" in out.text
    assert registry(redis_client) == [], "every record is removed at a clean stop"


def test_pool_is_listed_by_the_api(redis_client, spawned, admin_client):
    proc, out = spawned("default", "--processes", "2", "-c", "1", "--name", "pool-a")
    wait_until(lambda: len(children_of(redis_client, proc.pid)) == 2, timeout=60,
               message=f"two children in the registry:\n{out.text}")
    listed = admin_client.get("/api/delayq/workers/").json()
    by_role = {w["role"]: w for w in listed if w["role"] == "supervisor"}
    assert by_role["supervisor"]["name"] == "pool-a"
    assert by_role["supervisor"]["pid"] == proc.pid
    workers = sorted((w["name"], w["supervisor"]) for w in listed if w["role"] == "worker")
    assert workers == [("pool-a-0", "pool-a"), ("pool-a-1", "pool-a")]
    page = admin_client.get(reverse("admin:django_delayq_queues")).content.decode()
    assert page.count("child of pool-a") == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_sigterm_to_the_supervisor_finishes_running_jobs_and_hands_back_the_rest(
        redis_client, spawned):
    jobs = [tasks.gated.enqueue(f"g{i}", gate="gate:t") for i in range(6)]
    # each child (one thread, prefetch 2) holds three: one running and two waiting
    proc, out = spawned("default", "--processes", "2", "-c", "1", "--prefetch", "2")
    wait_until(lambda: len(starts(redis_client, "gated-start")) == 2, timeout=60,
               message="a job running in each child")
    assert Queue("default").counts()["active"] == 6
    tags = {r["tag"] for r in starts(redis_client, "gated-start")}
    running = [j for j in jobs if j.refresh().args[0] in tags]
    waiting = [j for j in jobs if j.args[0] not in tags]
    proc.send_signal(signal.SIGTERM)
    out.wait_for("host stopping")
    wait_until(lambda: out.text.count("worker stopping") == 2, message="both children stopping")
    assert proc.poll() is None, "the pool exited while its jobs were still running"
    redis_client.set("gate:t", 1)
    assert proc.wait(timeout=60) == 0, out.text
    for job in running:
        assert job.refresh().status == "completed"
    for job in waiting:
        job.refresh()
        assert (job.status, job.attempts) == ("ready", 0)
    assert len(starts(redis_client, "gated-start")) == 2, "no waiting job started"


def test_second_signal_to_the_supervisor_stops_at_once_with_code_1(redis_client, spawned):
    jobs = [tasks.gated.enqueue(f"n{i}", gate="gate:never") for i in range(2)]
    proc, out = spawned("default", "--processes", "2", "-c", "1", "--prefetch", "0")
    wait_until(lambda: len(starts(redis_client, "gated-start")) == 2, timeout=60,
               message=f"a job running in each child:\n{out.text}")
    children = [int(r["pid"]) for r in children_of(redis_client, proc.pid)]
    proc.send_signal(signal.SIGINT)
    out.wait_for("host stopping")
    wait_until(lambda: out.text.count("worker stopping") == 2, message="both children stopping")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 1, out.text
    for pid in children:
        assert not pid_alive(pid), "the supervisor stops with all of its children"
    # The worker processes ended while they held the jobs: handed back at once, the
    # attempt counted (not left leased until the lease lapses).
    for job in jobs:
        job.refresh()
        assert (job.status, job.attempts) == ("ready", 1), out.text
        assert "WorkerLost" in job.attempt_log[-1]["error"]


def test_burst_pool_runs_what_is_due_and_exits_zero(redis_client, spawned):
    for i in range(30):
        tasks.record.enqueue(f"b{i}")
    proc, out = spawned("default", "--processes", "2", "-c", "2", "--burst")
    assert proc.wait(timeout=120) == 0, out.text
    assert sorted(r["tag"] for r in starts(redis_client, "record")) == sorted(
        f"b{i}" for i in range(30))
    assert "burst done host=" in out.text
    assert " retry_in_s=" not in out.text, "a child done with its burst is not restarted"



def test_a_child_that_dies_is_restarted(redis_client, spawned):
    proc, out = spawned("default", "--processes", "2", "-c", "1")
    wait_until(lambda: len(children_of(redis_client, proc.pid)) == 2, timeout=60,
               message=f"two children in the registry:\n{out.text}")
    victim = int(children_of(redis_client, proc.pid)[0]["pid"])
    os.kill(victim, signal.SIGKILL)
    out.wait_for(f"pid={victim} code=-9")
    wait_until(lambda: out.text.count("started worker-") == 3, timeout=60,
               message=f"a third worker start:\n{out.text}")
    job = tasks.add.enqueue(1, 2)
    wait_until(lambda: job.refresh().status == "completed", timeout=60,
               message="a job after the restart")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_children_stop_when_the_supervisor_is_killed(redis_client, spawned):
    proc, out = spawned("default", "--processes", "2", "-c", "1")
    wait_until(lambda: len(children_of(redis_client, proc.pid)) == 2, timeout=60,
               message=f"two children in the registry:\n{out.text}")
    children = [int(r["pid"]) for r in children_of(redis_client, proc.pid)]
    proc.kill()
    proc.wait()
    out.wait_for("is gone: stopping")
    wait_until(lambda: not any(pid_alive(pid) for pid in children), timeout=30,
               message="orphaned children to stop")


@pytest.mark.slow
@pytest.mark.timeout(900)  # each kill costs a restart, with backoff: minutes on a busy machine
def test_soak_sigkill_a_busy_child_every_second_loses_nothing(redis_client, spawned,
                                                              fault_report):
    """10,000 jobs on three children; a busy child is frozen, what it holds is read, and
    it is SIGKILLed, every second until the queue drains (tens of kills: what each kill
    proves does not grow with the queue). Nothing is lost, and only jobs a killed child
    held run twice."""
    from tests.test_faults import held_by

    total, concurrency, prefetch = 10_000, 4, 20
    keys = QueueKeys("dq", "default")
    # job ids are the tags the task counts its runs under
    get_broker().enqueue_many("default", [
        EnqueueRequest(task=tasks.count_run.name, args=[f"j{i}", 0.005], job_id=f"j{i}",
                       max_attempts=100) for i in range(total)])
    proc, out = spawned("default", "--processes", "3", "-c", str(concurrency),
                        "--prefetch", str(prefetch), "--lease", "2", "--no-mirror", "-v", "0")
    held_at_kills: list[set[str]] = []
    deadline = time.monotonic() + 600  # a hang guard, not a speed limit

    def drained() -> bool:  # (the completed set keeps the newest KEEP_COMPLETED only)
        counts = Queue("default").counts()
        return (redis_client.hlen("test:count") == total
                and not (counts["ready"] or counts["active"] or counts["scheduled"]))

    while not drained():
        assert time.monotonic() < deadline, (
            f"the soak did not drain: {Queue('default').counts()}\n{out.text[-3000:]}")
        time.sleep(1.0)  # the pace of the fault, not a wait for an event
        busy = [r for r in children_of(redis_client, proc.pid)
                if r.get("busy") not in (None, "0")]
        if not busy:
            continue
        victim = busy[0]
        pid = int(victim["pid"])
        try:
            # Frozen, it changes nothing: what it holds now is what it can run twice.
            os.kill(pid, signal.SIGSTOP)
            held_at_kills.append(set(held_by(redis_client, keys, victim["name"])))
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # it had just died by itself
        finally:
            redis_client.delete(f"dq:worker:{victim['name']}")  # not to pick it again
    runs = {k: int(v) for k, v in redis_client.hgetall("test:count").items()}
    lost = [f"j{i}" for i in range(total) if runs.get(f"j{i}", 0) < 1]
    duplicated = {tag for tag, n in runs.items() if n > 1}
    kills = len(held_at_kills)
    fault_report(f"SIGKILL a busy pool child every 1 s ({kills} kills, 3 children)", total,
                 len(lost), len(duplicated))
    assert not lost, f"{len(lost)} jobs lost, e.g. {lost[:5]}"
    assert kills >= 3, f"children were seldom seen busy:\n{out.text}"
    outside = duplicated - set().union(*held_at_kills)
    assert not outside, f"ran twice, held by no killed child: {sorted(outside)[:5]}"
    assert max(map(len, held_at_kills)) <= concurrency + prefetch
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def run_to_completion(spawned: Any, jobs: list[Any], *args: str) -> str:
    """Run ``jobs`` on a pool started with ``args``, stop it warmly; its output."""
    proc, out = spawned("default", "--processes", "2", "-c", "1", *args)
    for job in jobs:
        wait_until(lambda job=job: job.refresh().status == "completed", timeout=120,
                   message="the jobs to complete")
    assert all(job.attempts == 1 for job in jobs), "a recycle runs no job twice"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text
    assert "exited to be replaced" in out.text
    return out.text


def test_a_leaking_child_is_recycled_with_nothing_lost(redis_client, spawned):
    # Each job outlasts the monitor's interval between two reads of the memory, so a
    # child's memory is read after each of its jobs: no child runs more jobs than its
    # 160 MiB allow (16 MiB each), and the 24 jobs need fresh children.
    jobs = [tasks.leak.enqueue(f"l{i}", 16, 1.5 * MEMORY_CHECK_INTERVAL)
            for i in range(24)]
    run_to_completion(spawned, jobs, "--prefetch", "2", "--max-memory-per-child", "160")
    done = starts(redis_client, "leak")
    assert sorted(r["tag"] for r in done) == sorted(f"l{i}" for i in range(24))
    assert len({r["pid"] for r in done}) > 2


def test_max_jobs_per_child_recycles_with_nothing_lost(redis_client, spawned):
    jobs = [tasks.record.enqueue(f"m{i}") for i in range(20)]
    run_to_completion(spawned, jobs, "--prefetch", "0", "--max-jobs-per-child", "3")
    done = starts(redis_client, "record")
    assert sorted(r["tag"] for r in done) == sorted(f"m{i}" for i in range(20))
    per_pid = Counter(r["pid"] for r in done)
    assert max(per_pid.values()) <= 3, per_pid  # one thread, no prefetch: 3 at most
    assert len(per_pid) >= 7


def test_a_recycle_lets_a_job_longer_than_the_grace_period_finish_and_runs_it_once(
        redis_client, spawned):
    """A process claims no more than the jobs it has left before its recycle, so its last
    jobs run to their end, however much longer than the grace period, and none is handed
    back; the next job waits for the fresh process."""
    long = tasks.sleeps.enqueue(5)
    quick = tasks.gated.enqueue("q", gate="gate:q")
    after = tasks.record.enqueue("after")
    proc, out = spawned("default", "-c", "2", "--prefetch", "0", "--grace-period", "0.5",
                        "--max-jobs-per-child", "2")
    wait_until(lambda: starts(redis_client, "sleeps") and starts(redis_client, "gated-start"),
               timeout=60, message=f"both jobs to start:\n{out.text}")
    assert after.refresh().status == "ready", "claimed beyond the jobs the process had left"
    redis_client.set("gate:q", 1)
    out.wait_for("worker-0 exited to be replaced", timeout=60)
    assert "recycling worker process" in out.text
    assert "handing back" not in out.text
    for job in (long, quick):
        job.refresh()
        assert (job.status, job.attempts) == ("completed", 1)
    wait_until(lambda: after.refresh().status == "completed", message="the next job")
    assert len(starts(redis_client, "sleeps")) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_max_jobs_without_a_pool_replaces_the_one_worker_process(redis_client, spawned):
    for i in range(5):
        tasks.record.enqueue(f"x{i}")
    proc, out = spawned("default", "-c", "1", "--prefetch", "0", "--max-jobs-per-child", "2")
    wait_until(lambda: len(starts(redis_client, "record")) == 5, timeout=60,
               message=f"every job, by fresh processes:\n{out.text}")
    per_pid = Counter(r["pid"] for r in starts(redis_client, "record"))
    assert sorted(per_pid.values()) == [1, 2, 2], "one thread, no prefetch: 2 at most"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text
    assert Queue("default").counts()["active"] == 0, "nothing is left leased"


def test_the_pools_mirror_process_mirrors_the_workers_last_events(redis_client, spawned,
                                                                 tmp_path):
    """The mirror stops after the workers: a job that ends during the warm stop has its
    row once the pool exits."""
    db = migrated_sqlite(tmp_path)
    jobs = [tasks.record.enqueue(f"p{i}") for i in range(10)]
    last = tasks.gated.enqueue("last", gate="gate:last")
    proc, out = spawned("default", "--processes", "2", "-c", "2",
                        env={"DELAYQ_TEST_SQLITE": db})

    def mirrored() -> bool:
        # Two processes claim apart: ``last`` can be active while the other process still
        # runs a ``p`` job, so the rows are awaited together, not read once.
        rows = sqlite_rows(db)
        return (rows.get(last.id) == "active"
                and all(rows.get(j.id) == "completed" for j in jobs))

    wait_until(mirrored, timeout=60, message=f"rows of the running pool:\n{out.text}")
    lines = stop_during_a_job(proc, out, redis_client, stopping="host stopping",
                              gate="gate:last")
    assert sqlite_rows(db)[last.id] == "completed"
    stopped = [first_line(lines, text) for text in
               ("worker-0 stopped pid=", "worker-1 stopped pid=", "mirror stopped consumer=")]
    assert stopped[2] > max(stopped[:2]), out.text


@pytest.mark.parametrize(("args", "message"), [
    (["--processes", "0"], "--processes must be at least 1"),
    (["--max-jobs-per-child", "0"], "--max-jobs-per-child must be at least 1"),
    (["--max-memory-per-child", "nan"], "--max-memory-per-child must be at least 1"),
    (["--max-memory-per-child", "0.5"], "--max-memory-per-child must be at least 1"),
])
def test_bad_pool_arguments_are_refused(args, message, spawned):
    proc, out = spawned(*args)
    assert proc.wait(timeout=60) == 1
    assert message in out.text


def test_children_keep_every_project_path_and_drop_the_interpreter_s_own():
    """Whole path components are compared: a project whose path merely starts with the
    interpreter's prefix (``/usr/src/app`` under ``/usr``) is the project's."""
    import site
    import sysconfig

    own = [sysconfig.get_paths()["stdlib"], *site.getsitepackages()]
    projects = [os.path.join(sys.base_prefix, "src", "app"), sys.prefix + "-app",
                os.path.join(sys.prefix, "src", "app")]
    zipped = os.path.join(sys.base_prefix, "lib",
                          f"python{sys.version_info[0]}{sys.version_info[1]}.zip")
    assert project_paths([*own, *projects, zipped, ""]) == [*projects, os.getcwd()]


@pytest.fixture
def project_beside_the_prefix() -> Any:
    """A project directory whose path starts with this interpreter's prefix (as
    ``/usr/src/app`` starts with ``/usr``), outside it; skipped where it cannot be made."""
    home = f"{sys.prefix}-delayq-test-{os.getpid()}"
    try:
        os.makedirs(os.path.join(home, "project"))
    except OSError as exc:
        pytest.skip(f"cannot create a directory beside {sys.prefix}: {exc}")
    try:
        yield os.path.join(home, "project")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_worker_process_finds_a_project_started_from_another_directory(
        redis_client, project_beside_the_prefix, tmp_path):
    """``python /path/manage.py runworker`` run from elsewhere, with a manage.py that has
    no ``__main__`` guard: the worker process gets the project's directory on its path,
    imports the settings and runs the job (and the script does not run again in it)."""
    project = project_beside_the_prefix
    with open(os.path.join(project, "beside_settings.py"), "w") as fh:
        fh.write("from tests.settings import *  # noqa: F403\n")
    with open(os.path.join(project, "manage.py"), "w") as fh:
        fh.write("import sys\n\nfrom django.core.management import execute_from_command_line"
                 "\n\nexecute_from_command_line(sys.argv)\n")
    job = tasks.record.enqueue("beside")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(project, "manage.py"), "runworker", "default"],
        cwd=elsewhere, env=worker_env(DJANGO_SETTINGS_MODULE="beside_settings"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = OutputReader(proc)
    try:
        wait_until(lambda: job.refresh().status == "completed" or "worker-0 died"
                   in out.text, timeout=60, message=f"the job:\n{out.text}")
        assert "worker-0 died" not in out.text, out.text
        assert out.text.count("host started") == 1, out.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.text
    finally:
        if proc.poll() is None:
            kill_with_children(proc)
