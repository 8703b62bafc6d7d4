"""``manage.py delayq_health``: its exit codes, against real workers and a real Redis."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command

from django_delayq.engine.workers import ALIVE_MS, count_alive, live_workers, record_alive
from tests.conftest import ROOT, wait_until, worker_env, worker_pids, worker_thread


def health(*args: str) -> tuple[int, str]:
    """Run delayq_health; (exit code, output)."""
    out = io.StringIO()
    try:
        call_command("delayq_health", *args, stdout=out, stderr=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_no_worker_is_exit_3():
    assert health()[0] == 3
    assert health("--worker", "nobody")[0] == 3


def test_a_running_worker_is_healthy():
    with worker_thread(queues=["default"], concurrency=2, name="probe-me"):
        _, out = wait_until(lambda: (r := health("--worker", "probe-me"))[0] == 0 and r,
                            message="the worker to register")
        assert "probe-me" in out
        assert "ok" in out
        assert health("--queue", "default")[0] == 0
        assert health("--queue", "other")[0] == 3, "nobody serves it"
        assert health()[0] == 0


def test_a_worker_with_no_live_thread_is_exit_1(broker):
    record_alive(broker, "no-threads", 60, {"queues": "default", "threads": 0, "lease": 30})
    code, out = health("--queue", "default")
    assert code == 1
    assert "no live thread" in out


def test_a_supervisor_with_no_live_child_is_exit_1(broker):
    record_alive(broker, "sup", 60, {"role": "supervisor", "queues": "", "threads": 0})
    code, out = health("--worker", "sup")
    assert code == 1
    assert "no live worker process" in out


def test_a_host_of_services_alone_is_healthy(broker):
    """delayq_mirror runs a host with no worker process by design: a probe of it (or a
    bare delayq_health) must not restart it for lacking one."""
    from django_delayq.runtime.host import Host

    Host(broker=broker, name="mirror-only")._record_alive()
    code, out = health("--worker", "mirror-only")
    assert code == 0, out
    assert health()[0] == 0


def test_a_queue_whose_worker_processes_are_all_down_is_unserved(broker):
    """A host's record names its processes' queues while none of them runs: the queue
    is unserved all the same (delayq_queue_unserved, the dashboard's warning)."""
    from django_delayq.engine.workers import served_queues

    record_alive(broker, "host-down", 60, {"role": "supervisor", "queues": "default",
                                           "threads": 0})
    assert served_queues(broker) == set()
    record_alive(broker, "w1", 60, {"queues": "default,other", "threads": 2, "lease": 30})
    assert served_queues(broker) == {"default", "other"}


@pytest.mark.django_db
def test_every_reader_takes_a_worker_silent_past_alive_ms_for_dead(broker, redis_client):
    """One definition of alive: the dashboard, the API and the metrics leave out a worker
    whose last heartbeat is older than ALIVE_MS; delayq_health reports it as dead."""
    from django.contrib.auth.models import User
    from django.test import Client

    from django_delayq.admin.dashboard import snapshot

    info = {"queues": "default", "threads": 1, "lease": 60}
    record_alive(broker, "beating", 120, info)
    record_alive(broker, "silent", 120, info)
    now = broker.server_time_ms()
    redis_client.zadd(broker.global_keys.workers, {"silent": now - ALIVE_MS - 1})
    assert [w.name for w in live_workers(broker)] == ["beating"]
    assert count_alive(broker) == 1
    assert {w.name for w in live_workers(broker, include_dead=True)} == {"beating", "silent"}
    assert [w.name for w in snapshot()["workers"]] == ["beating"]
    client = Client()
    client.force_login(User.objects.create_superuser("root"))
    assert [w["name"] for w in client.get("/api/delayq/workers/").json()] == ["beating"]
    scraped = client.get("/metrics/delayq/").content.decode()
    assert "delayq_workers_alive 1.0" in scraped.splitlines()
    code, out = health("--worker", "silent")
    assert code == 1, out
    assert "no heartbeat" in out
    assert health("--worker", "beating")[0] == 0


def test_a_frozen_worker_is_exit_1(spawned):
    proc, out = spawned("default", "-c", "1", "--lease", "1", "--name", "frozen")
    wait_until(lambda: (r := health("--worker", "frozen"))[0] == 0 and "frozen-0" in r[1],
               timeout=60, message="the worker process to register")
    (worker,) = worker_pids(out)
    os.kill(worker, signal.SIGSTOP)  # alive, but its heartbeat stops
    try:
        _, text = wait_until(lambda: (r := health("--worker", "frozen"))[0] == 1 and r,
                             timeout=30, message="the heartbeat to go stale")
        assert "no heartbeat for" in text
        assert health("--worker", "frozen", "--stale-after", "3600")[0] == 0
    finally:
        os.kill(worker, signal.SIGCONT)
    wait_until(lambda: health("--worker", "frozen")[0] == 0, timeout=30,
               message="the resumed worker to heartbeat again")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_pool_is_checked_through_its_supervisor(redis_client, spawned):
    proc, out = spawned("default", "--processes", "2", "-c", "1", "--name", "pool-h")
    wait_until(lambda: (r := health("--worker", "pool-h"))[0] == 0 and r[1].count(" ok") == 3,
               timeout=60, message="the host and its two worker processes")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text
    assert health("--worker", "pool-h")[0] == 3, "a clean stop removes the records"


@pytest.mark.parametrize("args", [["--stale-after", "-1"], ["--stale-after", "nan"],
                                  ["--queue", "bad{queue}"]])
def test_bad_arguments_are_exit_2(args):
    proc = subprocess.run([sys.executable, "-m", "django", "delayq_health", *args], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2, proc.stderr


def test_redis_unreachable_is_exit_4(settings: Any):
    from django_delayq import connection

    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": "redis://127.0.0.1:1/0",
                       "SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5}
    connection.reset()
    code, out = health()
    assert code == 4
    assert "is unreachable" in out


def test_a_dead_worker_process_on_this_host_is_exit_1_at_once(broker):
    """Its record still has a fresh heartbeat, but its pid is gone: unhealthy at once."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    record_alive(broker, "dead-here", 60, {"queues": "default", "threads": 4, "lease": 30,
                                            "pid": ended.pid})
    code, out = health("--worker", "dead-here")
    assert code == 1, out
    assert f"its process (pid {ended.pid}) on this host is gone" in out


def test_a_worker_of_another_host_is_judged_by_its_heartbeat(broker):
    record_alive(broker, "elsewhere", 60, {"queues": "default", "threads": 4, "lease": 30,
                                            "pid": 999_999_999, "host": "another-host"})
    # Its last heartbeat 5 s ago, however fast this test runs.
    keys, beat = broker.global_keys, broker.server_time_ms() - 5_000
    broker.client.hset(keys.worker("elsewhere"), "heartbeat", beat)
    broker.client.zadd(keys.workers, {"elsewhere": beat})
    assert health("--worker", "elsewhere")[0] == 0  # within its limit (3 beats + 1 s)
    code, out = health("--worker", "elsewhere", "--stale-after", "2")
    assert code == 1
    assert "no heartbeat for" in out
