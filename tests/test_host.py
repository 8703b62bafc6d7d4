"""A ``runworker``'s host: its worker process apart from the background loops on its own
threads; the mirror mirrors the workers' last events as the host stops, is off without
its table, and is left alone by other mirrors while it drains."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from typing import Any

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
    worker_pids,
)
from tests.testapp import tasks


def test_the_host_runs_the_mirror_beside_its_worker_process_and_stops_it_last(
        redis_client, spawned, tmp_path):
    db = migrated_sqlite(tmp_path)
    first = tasks.record.enqueue("first")
    proc, out = spawned("default", "-c", "2", env={"DELAYQ_TEST_SQLITE": db})
    (worker,) = worker_pids(out)
    assert worker != proc.pid, "jobs run in a process of their own"
    wait_until(lambda: sqlite_rows(db).get(first.id) == "completed", timeout=60,
               message=f"the first row:\n{out.text}")
    assert "mirror started consumer=" in out.text
    last = tasks.gated.enqueue("last", gate="gate:last")
    wait_until(lambda: sqlite_rows(db).get(last.id) == "active", timeout=60,
               message=f"the running job's row:\n{out.text}")
    # stopped after the worker's last acks, it mirrors them before it exits
    lines = stop_during_a_job(proc, out, redis_client, stopping="worker stopping",
                              gate="gate:last")
    assert sqlite_rows(db)[last.id] == "completed"
    assert first_line(lines, "mirror stopped") > first_line(lines, "worker-0 stopped"), out.text
    assert not pid_alive(worker)


def test_the_worker_process_stops_when_its_host_is_killed(redis_client, spawned):
    job = tasks.record.enqueue("before")
    proc, out = spawned("default", "-c", "1")
    (worker,) = worker_pids(out)
    wait_until(lambda: job.refresh().status == "completed", timeout=60,
               message=f"a job:\n{out.text}")
    proc.kill()
    proc.wait()
    wait_until(lambda: not pid_alive(worker), timeout=30,
               message="the orphaned worker process to stop by itself")


def test_the_mirror_is_off_without_its_table(redis_client, spawned):
    job = tasks.record.enqueue("no-table")
    proc, out = spawned("default", "--burst")
    assert proc.wait(timeout=60) == 0, out.text
    assert job.refresh().status == "completed"
    assert "the mirror is off: the Job table is missing" in out.text
    assert "mirror started" not in out.text


@pytest.mark.parametrize("signals", [1, 2])
def test_delayq_mirror_drains_after_a_first_signal(tmp_path, signals):
    """A first signal lets the mirror write what is left (at most 5 s); a second one
    cuts that short: either way it exits 0."""
    db = migrated_sqlite(tmp_path)
    tasks.record.enqueue("an event")
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "delayq_mirror", "-v", "1"], cwd=ROOT,
        env=worker_env(DELAYQ_TEST_SQLITE=db), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    out = OutputReader(proc)
    try:
        out.wait_for("mirror started consumer=", timeout=60)
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_with_children(proc)
    assert code == 0, out.text
    assert "host stopped" in out.text
    if signals == 1:
        assert "burst=True" in out.text, out.text


def test_other_mirrors_leave_a_stopping_host_s_mirror_alone_while_it_drains(
        redis_client, broker, spawned, tmp_path):
    """The host's record stays until its mirror has stopped: until then its consumer
    (<host>/mirror) is not taken for gone, so no other mirror takes over the events it is
    still writing."""
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


def test_sighup_is_a_warm_stop_that_leaves_no_worker_record(broker, spawned):
    """SIGHUP (a closed terminal, a process manager) stops a pool as SIGTERM does: the
    running job finishes, exit 0, and no record of the host or its workers is left."""
    from django_delayq.engine.workers import live_workers

    jobs = [tasks.record.enqueue(f"h{i}") for i in range(20)]
    last = tasks.gated.enqueue("last", gate="gate:hup")
    proc, out = spawned("default", "--processes", "2", "-c", "2")
    wait_until(lambda: last.refresh().status == "active"
               and all(j.refresh().status == "completed" for j in jobs), timeout=60,
               message=f"the jobs run, the last one running:\n{out.text}")
    assert {w.role for w in live_workers(broker)} == {"supervisor", "worker"}
    stop_during_a_job(proc, out, broker.client, stopping="host stopping", gate="gate:hup",
                      signum=signal.SIGHUP)
    assert last.refresh().status == "completed"
    assert live_workers(broker, include_dead=True) == []


def one_worker_running(spawned: Any, gate: str, *, hup_ignored: bool) -> tuple[Any, ...]:
    """A ``runworker -c 1`` (one worker process) running a job held by ``gate``: its
    process, output, worker pid and the job."""
    job = tasks.gated.enqueue("running", gate=gate)
    proc, out = spawned("default", "-c", "1", hup_ignored=hup_ignored)
    (worker,) = worker_pids(out)
    wait_until(lambda: job.refresh().status == "active", timeout=60,
               message=f"the job running:\n{out.text}")
    return proc, out, worker, job


def test_sighup_to_a_worker_process_is_a_warm_stop(broker, spawned):
    """A worker process SIGHUPed on its own stops warmly (exit 0, its job finished) and
    its host starts another."""
    proc, out, worker, job = one_worker_running(spawned, "gate:hup1", hup_ignored=False)
    os.kill(worker, signal.SIGHUP)
    out.wait_for("worker stopping")
    broker.client.set("gate:hup1", 1)
    out.wait_for(f"worker-0 died pid={worker} code=0", timeout=60)
    assert job.refresh().status == "completed"
    wait_until(lambda: len(worker_pids(out, 2)) == 2, timeout=60,
               message=f"another worker process:\n{out.text}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


#: A process whose stop handler takes a lock its main thread holds when the signal comes
#: (as Event.set takes the lock Event.wait holds for a moment, or a log handler the
#: stream's). Run in the signal handler, the stop would wait for that lock for ever.
_STOP_UNDER_A_HELD_LOCK = """
import os, signal, threading
from django_delayq.worker.process import install_stop_signals

lock, stopped = threading.Lock(), threading.Event()

def request_stop():
    with lock:
        stopped.set()

received = install_stop_signals(request_stop)
with lock:
    os.kill(os.getpid(), signal.SIGTERM)
    print("signalled", flush=True)
assert stopped.wait(60), "the stop never came"
print("stopped", received == [signal.SIGTERM], flush=True)
"""


def test_a_stop_signal_never_waits_on_a_lock_the_interrupted_code_holds():
    done = subprocess.run([sys.executable, "-c", _STOP_UNDER_A_HELD_LOCK], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["signalled", "stopped", "True"], done.stdout


#: A process whose main thread is blocked in a system call (an idle worker's main thread
#: may wait so for minutes) when the kernel hands a stop signal to another of its threads,
#: as it may when the main thread has a signal pending. The main thread is not woken: a
#: stop that waited for it to run Python code never came.
_STOP_TO_ANOTHER_THREAD = """
import os, signal, threading, time
from django_delayq.worker.process import install_stop_signals

def request_stop():
    print("stopped", flush=True)
    os._exit(0)

install_stop_signals(request_stop)
read_fd, _ = os.pipe()  # never written: the main thread reads it for ever
main = threading.get_native_id()

def signal_this_thread():
    wchan, deadline = "", time.monotonic() + 60
    while "pipe_read" not in wchan:  # until the main thread is blocked in its read
        with open(f"/proc/self/task/{main}/wchan") as f:
            wchan = f.read()
        if time.monotonic() > deadline:
            print("the main thread never waited in its read", flush=True)
            os._exit(3)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=signal_this_thread).start()
os.read(read_fd, 1)
"""


def test_a_stop_signal_another_thread_receives_stops_a_main_thread_that_waits():
    done = subprocess.run([sys.executable, "-c", _STOP_TO_ANOTHER_THREAD], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr  # only the stop exits 0
    assert done.stdout.split() == ["stopped"], done.stdout


#: A handler set for SIGTERM after the stop handlers takes SIGTERM over: the relay, which
#: the wakeup fd still brings its number to, leaves it alone. SIGHUP, sent after it, is
#: relayed (the pipe keeps their order), so the stop handler sees SIGHUP alone.
_A_LATER_HANDLER_TAKES_OVER = """
import os, signal, threading
from django_delayq.worker.process import install_stop_signals

stopped, taken = threading.Event(), threading.Event()
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # handled even if the suite runs under nohup
received = install_stop_signals(stopped.set)
signal.signal(signal.SIGTERM, lambda signum, frame: taken.set())
os.kill(os.getpid(), signal.SIGTERM)
assert taken.wait(60), "the later handler never ran"
os.kill(os.getpid(), signal.SIGHUP)
assert stopped.wait(60), "the stop never came"
print(received, flush=True)
"""


def test_a_handler_set_after_the_stop_handlers_takes_its_signal_over():
    done = subprocess.run([sys.executable, "-c", _A_LATER_HANDLER_TAKES_OVER], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [f"[{int(signal.SIGHUP)}]"], done.stdout


#: A process with stop handlers forks without exec (a task's multiprocessing pool does)
#: and the child is sent SIGTERM, as Pool.terminate sends it. The child must die of it,
#: and the parent must not take it as its own stop.
_STOP_TO_A_FORKED_CHILD = """
import os, signal, threading
from django_delayq.worker.process import install_stop_signals

stopped = threading.Event()
received = install_stop_signals(stopped.set)
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(3)  # alive after its SIGTERM
_, status = os.waitpid(child, 0)
print("child", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # the parent's own stop: the first it receives
assert stopped.wait(60), "the parent's stop never came"
print("parent", received, flush=True)
"""


def test_a_forked_child_dies_of_a_stop_signal_and_the_parent_runs_on():
    done = subprocess.run([sys.executable, "-c", _STOP_TO_A_FORKED_CHILD], cwd=ROOT,
                          env=worker_env(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr  # a second stop exits 1
    assert done.stdout.split() == ["child", "True", "parent", f"[{int(signal.SIGTERM)}]"], \
        done.stdout


def test_a_worker_started_under_nohup_runs_on_through_sighup(broker, spawned):
    """Started with SIGHUP ignored (``nohup``), the host and its worker process keep
    ignoring it: the job runs on and no stop begins; SIGTERM still stops them warmly."""
    proc, out, worker, job = one_worker_running(spawned, "gate:nohup", hup_ignored=True)
    os.kill(worker, signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    # A job enqueued after both signals, run by the same process: they were delivered.
    after = tasks.record.enqueue("after the SIGHUPs")
    broker.client.set("gate:nohup", 1)
    wait_until(lambda: after.refresh().status == "completed", timeout=60,
               message=f"the next job run by the same process:\n{out.text}")
    assert proc.poll() is None, out.text
    assert pid_alive(worker), out.text
    assert out.text.count("started worker-") == 1, out.text  # never replaced
    assert "host stopping" not in out.text, out.text
    assert "worker stopping" not in out.text, out.text
    assert job.refresh().status == "completed"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text
