"""``manage.py runworker`` in real processes: signals, crashes and Redis restarts."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from django_delayq import Job, Queue
from django_delayq.engine.fields import stored
from django_delayq.testing import RedisServer
from tests.conftest import (
    ROOT,
    kill_with_children,
    ran,
    wait_until,
    worker_env,
    worker_pids,
)
from tests.testapp import tasks


def started(client, tag: str) -> bool:
    return any(r["task"] == "gated-start" and r["tag"] == tag for r in ran(client))


def test_burst_runs_what_is_due_and_exits_zero(redis_client):
    for i in range(20):
        tasks.record.enqueue(f"b{i}")
    later = tasks.record.using(delay=3600).enqueue("later")
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runworker", "default", "--burst", "-c", "3"],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(ran(redis_client)) == 20
    assert later.refresh().status == "scheduled"
    assert "burst done" in proc.stderr


def test_sigkill_mid_job_is_finished_by_another_worker_after_the_lease(redis_client, spawned):
    """The machine dies: runworker and its worker process are killed mid-job."""
    job = tasks.gated.enqueue("k", gate="gate:k")
    victim, victim_out = spawned("default", "--lease", "1", "-c", "1")
    (victim_pid,) = worker_pids(victim_out)
    wait_until(lambda: started(redis_client, "k"), message="job start in first worker")
    kill_with_children(victim)
    # leased: active, or claimed if the note of its start had not landed yet
    assert job.refresh().status in ("claimed", "active")
    redis_client.set("gate:k", 1)
    _, out = spawned("default", "--lease", "1", "-c", "1")
    (survivor_pid,) = worker_pids(out)
    wait_until(lambda: job.refresh().status == "completed", timeout=30,
               message=f"reclaimed job to complete:\n{out.text}")
    assert job.attempts == 2
    pids = [r["pid"] for r in ran(redis_client) if r["task"] == "gated-start"]
    assert pids == [victim_pid, survivor_pid]
    assert "reclaimed expired leases" in out.wait_for("reclaimed expired leases")


def test_sigterm_finishes_the_running_job_and_hands_back_the_rest(redis_client, spawned):
    running = tasks.gated.enqueue("t1", gate="gate:t")
    waiting = [tasks.gated.enqueue(f"w{i}", gate="gate:t") for i in range(3)]
    proc, out = spawned("default", "-c", "1", "--prefetch", "3")
    wait_until(lambda: started(redis_client, "t1"), message="first job start")
    wait_until(lambda: Queue("default").counts()["active"] == 4, message="prefetched jobs")
    proc.send_signal(signal.SIGTERM)
    out.wait_for("worker stopping")
    assert proc.poll() is None, "worker exited while its job was still running"
    redis_client.set("gate:t", 1)
    assert proc.wait(timeout=30) == 0, out.text
    assert running.refresh().status == "completed"
    for job in waiting:
        job.refresh()
        assert (job.status, job.attempts) == ("ready", 0)
    assert "handed back jobs jobs=3 " in out.text


def test_second_signal_exits_at_once_with_code_1(redis_client, spawned):
    job = tasks.gated.enqueue("s", gate="gate:never")
    proc, out = spawned("default", "-c", "1")
    wait_until(lambda: started(redis_client, "s"), message="job start")
    proc.send_signal(signal.SIGINT)
    out.wait_for("worker stopping")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 1
    job.refresh()
    # its worker process ended while it held the job: handed back at once, not after the lease
    assert (job.status, job.attempts) == ("ready", 1), out.text
    assert "WorkerLost" in job.attempt_log[-1]["error"]


def test_worker_survives_a_redis_restart(spawned):
    with RedisServer() as server:
        proc, out = spawned("default", "-c", "2", redis_url=server.url)
        out.wait_for("worker started")
        client = server_client(server.url)
        broker = make_broker(client)
        first = broker.enqueue("default", tasks.record.name, ["before"])
        wait_until(lambda: client.hget(job_key(first.job_id), stored("status")) == "completed",
                   message="job before restart")
        server.kill()
        out.wait_for("redis unavailable", timeout=30)
        server.start()
        second = broker.enqueue("default", tasks.record.name, ["after"])
        wait_until(lambda: client.hget(job_key(second.job_id), stored("status")) == "completed",
                   timeout=30, message=f"job after restart:\n{out.text}")
        assert proc.poll() is None, "the worker must recover by itself"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def server_client(url: str):
    import redis

    return redis.Redis.from_url(url, decode_responses=True)


def make_broker(client):
    from django_delayq.engine import Broker, EngineConfig

    return Broker(client, EngineConfig())


def job_key(job_id: str) -> str:
    from django_delayq.engine import QueueKeys

    return QueueKeys("dq", "default").job(job_id)


@pytest.mark.parametrize(("args", "message"), [
    (["bad{queue}"], "invalid queue name"),
    (["--concurrency", "0"], "--concurrency must be at least 1"),
    (["--lease", "0"], "--lease must be more than 0"),
    (["--lease", "nan"], "--lease must be more than 0 (a finite number), not nan"),
    (["--lease", "inf"], "--lease must be more than 0"),
    (["--prefetch", "-1"], "--prefetch must be at least 0"),
    (["--grace-period", "-1"], "--grace-period must be at least 0"),
    (["--grace-period", "nan"], "--grace-period must be at least 0"),
    (["--timeout", "0"], "--timeout must be more than 0"),
    (["--timeout", "-1"], "--timeout must be more than 0"),
    (["--timeout", "nan"], "--timeout must be more than 0"),
])
def test_bad_arguments_are_refused(args, message):
    proc = subprocess.run([sys.executable, "-m", "django", "runworker", *args], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 1
    assert message in proc.stderr


def test_job_fetch_after_worker(redis_client):
    job = tasks.add.enqueue(2, 2)
    proc = subprocess.run([sys.executable, "-m", "django", "runworker", "--burst"], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert Job.fetch(job.id).result == 4


def test_base_exceptions_in_a_real_process_fail_their_jobs_only(redis_client):
    failing = [tasks.raises.enqueue(kind) for kind in tasks.BASE_EXCEPTIONS]
    after = tasks.record.enqueue("after")
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runworker", "default", "--burst", "-c", "1"],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert after.refresh().status == "completed"
    for job in failing:
        assert job.refresh().status == "failed", job.error


def test_os_exit_in_a_task_kills_its_process_which_is_replaced_and_runs_the_job_again(
        redis_client, spawned):
    job = tasks.exits_process.enqueue("x")
    proc, out = spawned("default", "--lease", "1", "-c", "1")
    out.wait_for("worker-0 died pid=")
    wait_until(lambda: job.refresh().status == "completed", timeout=30,
               message=f"the job to run again:\n{out.text}")
    assert job.attempts == 2
    pids = [r["pid"] for r in ran(redis_client) if r["task"] == "exits_process"]
    assert pids == worker_pids(out, 2)
    assert "code=7" in out.text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_child_a_task_forks_ends_on_its_return_and_runs_no_other_job(redis_client,
                                                                       spawned):
    """A forked child that returns (or raises SystemExit) comes back to the worker's
    code: it must end there, as a script would, not run the worker's buffered jobs a
    second time and live on after the worker."""
    tags = [f"t{i}" for i in range(300)]
    first = [tasks.record.enqueue(tag) for tag in tags[:100]]
    forks = [tasks.forks.enqueue("return"), tasks.forks.enqueue("exit"),
             tasks.forks_async.enqueue()]
    rest = [tasks.record.enqueue(tag) for tag in tags[100:]]
    proc, out = spawned("default", "-c", "4", "--prefetch", "40")
    wait_until(lambda: all(j.refresh().status == "completed" for j in [*first, *forks, *rest]),
               timeout=120, message=f"every job to complete:\n{out.text}")
    assert [j.result for j in forks] == [0, 3, 0]  # the children's exit codes
    ran_tags = [r["tag"] for r in ran(redis_client) if r["task"] == "record"]
    assert sorted(ran_tags) == sorted(tags)  # each once: no child ran one again
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_job_swallowing_its_timeout_is_failed_and_its_process_replaced(redis_client,
                                                                         spawned):
    job = tasks.swallows_timeout.enqueue("hard")
    others = [tasks.record.enqueue(f"o{i}") for i in range(3)]
    proc, out = spawned("default", "-c", "2")
    out.wait_for("worker-0 exited to be replaced", timeout=60)
    job.refresh()
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.error.startswith("django_delayq.engine.errors.JobTimeout: the job ran past "
                                "its time limit of 0.5s and did not stop"), job.error
    swallowed = [r for r in ran(redis_client) if r["task"] == "swallowed"]
    assert swallowed, "the soft limit came first"
    assert swallowed[0]["error"] == "JobTimeout"
    for other in others:
        assert other.refresh().status == "completed", "the other thread went on meanwhile"
    assert "stopping this worker to be restarted" in out.text
    after = tasks.record.enqueue("after")
    wait_until(lambda: after.refresh().status == "completed", timeout=60,
               message=f"the next job, in the fresh process:\n{out.text}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_job_blocked_in_c_code_is_failed_at_the_hard_limit(redis_client, spawned):
    """``time.sleep(3600)`` is one C call: the soft JobTimeout waits for it to return, so
    only the hard limit ends the job (and the process, replaced by its host)."""
    job = tasks.blocks_in_c.enqueue("c")
    proc, out = spawned("default", "-c", "1")
    out.wait_for("worker-0 exited to be replaced", timeout=60)
    job.refresh()
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.error.startswith("django_delayq.engine.errors.JobTimeout: the job ran past "
                                "its time limit of 0.5s and did not stop within 5.0s "
                                "(blocked in C code"), job.error
    notes = [r["task"] for r in ran(redis_client)]
    assert notes == ["blocks_in_c"], "the sleep never returned in the task"
    assert "JobTimeout raised in it" in out.text, "the soft limit came first, in vain"
    assert Queue("default").counts()["active"] == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_runworker_timeout_limits_jobs_whose_task_sets_none(redis_client):
    job = tasks.sleeps.enqueue(60)
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runworker", "default", "--burst", "--timeout", "0.3"],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    job.refresh()
    assert (job.status, job.attempts) == ("failed", 1)
    assert "JobTimeout" in job.error


def test_burst_reclaims_expired_leases_of_dead_workers(redis_client, broker):
    from django_delayq.engine import QueueKeys

    job = tasks.record.enqueue("orphan")
    (claim,) = broker.claim("default", 1, "dead-worker", lease_ms=1)
    assert [j.id for j in claim.jobs] == [job.id]
    active = QueueKeys("dq", "default").active
    wait_until(lambda: redis_client.zscore(active, job.id) < broker.server_time_ms(),
               message="the lease to lapse")
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runworker", "default", "--burst"],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "reclaimed expired leases queue=default returned=1" in proc.stderr
    job.refresh()
    assert (job.status, job.attempts) == ("completed", 2)
    first, second = job.attempt_log
    assert (first["attempt"], first["worker"], first["outcome"]) == (1, "dead-worker",
                                                                      "reclaimed")
    assert (second["attempt"], second["outcome"]) == (2, "completed")
    assert "worker stopped" in proc.stderr
    assert "jobs=1 completed=1 retried=0 failed=0" in proc.stderr


@pytest.mark.parametrize("verbosity", ["1", "0"])
def test_one_line_per_finished_job_and_a_summary_that_counts_jobs(redis_client, verbosity):
    done = tasks.record.enqueue("line")
    bad = tasks.returns_unjsonable.enqueue()
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runworker", "default", "--burst", "-v", verbosity],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    completed = [x for x in lines if f"job completed job={done.id}" in x]
    failed = [x for x in lines if f"job failed job={bad.id}" in x]
    assert len(failed) == 1, proc.stderr  # errors show at every verbosity
    assert f"task={tasks.returns_unjsonable.name} queue=default attempt=1/1" in failed[0]
    assert 'error="builtins.TypeError' in failed[0]
    if verbosity == "0":
        assert completed == []
        assert "worker stopped" not in proc.stderr
        return
    assert len(completed) == 1, proc.stderr
    assert f"task={tasks.record.name} queue=default attempt=1/3 duration_ms=" in completed[0]
    assert "jobs=2 completed=1 retried=0 failed=1" in proc.stderr
