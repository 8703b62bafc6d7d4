"""Worker processes of the benchmark: started in process groups of their own, found
again through ``/proc`` with every descendant, and always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, NamedTuple

BENCH_DIR = Path(__file__).resolve().parent.parent
ROOT = BENCH_DIR.parent
#: The directory of the adapters: the task modules the workers import, by their short
#: names (``rq_bench``, ``delayq_benchapp.tasks``), as a project's directory is on its
#: workers' path. Those names are stored in every job, so they weigh in the bytes per job.
ADAPTERS_DIR = BENCH_DIR / "adapters"
LOG_DIR = BENCH_DIR / "results" / "tmp"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_logs: dict[int, IO[bytes]] = {}


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the adapters and this checkout first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ADAPTERS_DIR), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def start_process(argv: Sequence[str], name: str,
                  extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a worker in its own process group, logging to ``results/tmp/<name>.log``."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = open(LOG_DIR / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop_processes
    proc = subprocess.Popen(list(argv), cwd=str(ADAPTERS_DIR), env=worker_env(extra_env),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    _logs[proc.pid] = log
    return proc


class ProcStat(NamedTuple):
    ppid: int
    group: int
    cpu_s: float  # user + system
    started: int  # clock ticks after boot: with the pid, names one process


def proc_stat(pid: int | str) -> ProcStat | None:
    """Parent, process group, CPU seconds and start of ``pid`` from ``/proc``; None if it
    is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces): state ppid pgrp ... utime stime
    # ... starttime (proc(5) numbers them from 1 with the pid and the name first)
    fields = text.rsplit(")", 1)[1].split()
    return ProcStat(int(fields[1]), int(fields[2]),
                    (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[19]))


def process_tree(roots: Iterable[int]) -> dict[int, ProcStat]:
    """Every live process in the process groups of ``roots`` (each leads its own), or
    descended from one of them: a process pool's children count even when they were
    started in sessions of their own."""
    roots = set(roots)
    stats = {int(pid): st for pid in os.listdir("/proc")
             if pid.isdigit() and (st := proc_stat(pid)) is not None}
    members = {pid for pid, st in stats.items() if pid in roots or st.group in roots}
    grown = True
    while grown:
        more = {pid for pid, st in stats.items() if st.ppid in members} - members
        members |= more
        grown = bool(more)
    return {pid: stats[pid] for pid in members}


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM each worker's process group, then SIGKILL whatever of its tree is left
    after ``grace``."""
    procs = list(procs)
    tree = process_tree(p.pid for p in procs)  # before the parents exit and orphan them
    for p in procs:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        # Children of a prefork/process pool may outlive their parent: kill the group.
        _signal_group(p.pid, signal.SIGKILL)
    for pid, st in tree.items():
        current = proc_stat(pid)
        if current is not None and current.started == st.started:  # the same process
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
        log = _logs.pop(p.pid, None)
        if log is not None:
            log.close()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
