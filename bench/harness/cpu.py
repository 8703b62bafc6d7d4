"""CPU accounting: this process, the Redis server, and the worker processes sampled with
the completion count while a backlog drains."""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from .marks import COUNT_KEY
from .processes import proc_stat, process_tree

GROUP_RESCAN = 1.0  # seconds between scans of /proc for the workers' processes
# /proc counts CPU in clock ticks (10 ms): a shorter span between samples gives no figure.
MIN_CPU_SPAN_S = 0.2


def own_cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_cpu_s(r: Any) -> float:
    """CPU seconds (user + system) the Redis server has used (``INFO cpu``)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Sample(NamedTuple):
    done: int  # the completion count
    at: float  # monotonic seconds
    redis_s: float
    workers_s: float


class CpuSampler:
    """CPU used by the worker processes (every process of their process groups and every
    descendant: threads and pool children included) and by Redis, sampled with the
    completion count while a backlog drains, so that the CPU per job can be read over
    the measured window."""

    def __init__(self, r: Any, procs: Sequence[subprocess.Popen[bytes]]) -> None:
        self.r = r
        self.roots = [p.pid for p in procs]  # start_process gives each its own group
        self.members: list[int] = []
        self.scanned = -GROUP_RESCAN
        self.samples: list[Sample] = []

    def _workers_cpu(self) -> float:
        now = time.monotonic()
        if now - self.scanned >= GROUP_RESCAN:
            self.scanned = now
            self.members = list(process_tree(self.roots))
        return sum(st.cpu_s for pid in self.members if (st := proc_stat(pid)) is not None)

    def sample(self) -> int:
        """Record one sample; returns the completion count."""
        count = int(self.r.get(COUNT_KEY) or 0)
        self.samples.append(Sample(count, time.monotonic(), redis_cpu_s(self.r),
                                   self._workers_cpu()))
        return count

    def per_job_us(self, lo: int, hi: int) -> dict[str, float] | None:
        """Microseconds of CPU per job between the first and the last sample taken with
        the count in [lo, hi]; None when those samples are less than MIN_CPU_SPAN_S
        apart (or the count did not move), too short for CPU counted in clock ticks."""
        inside = [s for s in self.samples if lo <= s.done <= hi]
        if len(inside) < 2 or inside[-1].done == inside[0].done:
            return None
        first, last = inside[0], inside[-1]
        if last.at - first.at < MIN_CPU_SPAN_S:
            return None
        jobs = last.done - first.done
        return {"workers": 1e6 * (last.workers_s - first.workers_s) / jobs,
                "redis": 1e6 * (last.redis_s - first.redis_s) / jobs, "jobs": jobs}
