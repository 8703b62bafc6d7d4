"""The deadline board: the jobs a worker process runs and their time limits, readable
by its host, which the worker's own GIL cannot freeze.

A time limit enforced inside the process that runs the job stops when C code holds the
GIL (a catastrophic regex, a long C call that does not release it): the watchdog thread,
the heartbeat and the signal handlers all wait for it. So each worker process shares a
small memory block with its host (:class:`Board`: an anonymous file the host creates and
passes to the child by descriptor, then maps): one fixed-size record per job slot
(executor threads and event-loop slots) holding the running job's queue, id, attempt,
start, retry delay and the moment its hard limit (time limit plus grace) passes, and a
stamp the process writes every :data:`STAMP_EVERY` seconds from a thread of its own.
Writing a record is a few memory writes, no system call, so it costs nothing per job.
Every job that starts is posted, limited or not: when the process ends, its host knows
which of its jobs ran, even those whose start note never reached Redis.

The host (:mod:`.children`) reads every board each turn. A job still posted
:data:`KILL_MARGIN` seconds after its hard limit (the in-process watchdog fails it at the
hard limit and has had that long to do so) or a stamp older than the process's
``frozen_after`` means the process no longer runs Python: the host kills it, fails the
overrun jobs and hands back the rest at once (:mod:`.host`).

Records use a sequence number (odd while written), so a read never sees half a record;
``time.monotonic()`` is the system-wide CLOCK_MONOTONIC on Linux, the same in both
processes.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import tempfile
import threading
import time
from dataclasses import dataclass

#: Seconds between two stamps of a live process.
STAMP_EVERY = 1.0
#: Seconds the in-process watchdog has, past a job's hard limit, before the host kills.
KILL_MARGIN = 2.0
#: The fewest seconds without a stamp after which a process is taken for frozen.
MIN_FROZEN = 10.0


def frozen_after(lease: float) -> float:
    """Seconds without a stamp after which a worker process with leases of ``lease``
    seconds is frozen: its leases have lapsed by then, other workers take its jobs, so
    it holds nothing it could still finish."""
    return max(lease, MIN_FROZEN)

_MAGIC = b"DQB1"
_HEADER = struct.Struct("<4sId")  # magic, the writer's pid, its last stamp
_SEQ = struct.Struct("<I")
# seq, attempt, hard limit at (inf: no limit), time limit (s; 0: none), retry delay
# (ms), start (ms, Redis clock), queue, job id (the lengths are the engine's limits),
# who asked for its abort (its start; empty: nobody)
_RECORD = struct.Struct("<IIddiq64s128s24s")
_HARD_AT = struct.Struct("<d")
_HARD_AT_OFFSET = struct.calcsize("<II")
_SLOT = 256
_HEADER_SIZE = 64


@dataclass(frozen=True)
class Posted:
    """One job a board holds: what its host needs to fail it."""

    queue: str
    job_id: str
    attempt: int
    hard_at: float
    timeout: float
    retry_delay_ms: int
    started_ms: int
    #: Who asked for its abort (the start of it; '' when nobody did): ``hard_at`` is
    #: then the end of the abort's grace.
    aborted_by: str = ""


class Board:
    """A shared block of ``slots`` records over the file descriptor ``fd``."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd = fd
        self.slots = slots
        self._map = mmap.mmap(fd, _HEADER_SIZE + slots * _SLOT)
        self._free = list(range(slots - 1, -1, -1))

    @classmethod
    def create(cls, slots: int) -> Board:
        """A zeroed board in an anonymous file (a memfd where the system has one),
        inheritable by a child process."""
        size = _HEADER_SIZE + slots * _SLOT
        try:
            fd = os.memfd_create("delayq-board", 0)
        except (AttributeError, OSError):  # not Linux: an unlinked temporary file
            fd, path = tempfile.mkstemp(prefix="delayq-board-")
            os.unlink(path)
        os.ftruncate(fd, size)
        return cls(fd, slots)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    # -- the worker process's side ----------------------------------------------------

    def stamp(self) -> None:
        """Say this process ran Python now (and that the board is its own)."""
        _HEADER.pack_into(self._map, 0, _MAGIC, os.getpid(), time.monotonic())

    def keep_stamping(self, until: threading.Event) -> threading.Thread:
        """Stamp every :data:`STAMP_EVERY` seconds on a thread of its own, until
        ``until`` is set (the process's end: a stopping process is watched too)."""
        def run() -> None:
            while True:
                self.stamp()
                if until.wait(STAMP_EVERY):
                    return

        thread = threading.Thread(target=run, name="delayq-stamp", daemon=True)
        thread.start()
        return thread

    def post(self, queue: str, job_id: str, attempt: int, *, started_ms: int,
             hard_at: float = math.inf, timeout: float = 0.0,
             retry_delay_ms: int = 1000) -> int | None:
        """Post a job that started; its slot (None if the board is full)."""
        try:
            slot = self._free.pop()  # atomic: the posting threads need no lock of ours
        except IndexError:
            return None
        offset = _HEADER_SIZE + slot * _SLOT
        seq = _SEQ.unpack_from(self._map, offset)[0]
        _SEQ.pack_into(self._map, offset, seq + 1)
        _RECORD.pack_into(self._map, offset, seq + 1, attempt, hard_at, timeout,
                          retry_delay_ms, started_ms, queue.encode(), job_id.encode(), b"")
        _SEQ.pack_into(self._map, offset, seq + 2)
        return slot

    def abort(self, slot: int, hard_at: float, by: str) -> None:
        """The job of ``slot`` was asked to stop: its hard limit is ``hard_at`` now."""
        offset = _HEADER_SIZE + slot * _SLOT
        seq, *values = _RECORD.unpack_from(self._map, offset)
        values[1], values[-1] = hard_at, (by or "?").encode()[:24]
        _SEQ.pack_into(self._map, offset, seq + 1)
        _RECORD.pack_into(self._map, offset, seq + 1, *values)
        _SEQ.pack_into(self._map, offset, seq + 2)

    def clear(self, slot: int) -> None:
        """The job of ``slot`` is over (or no longer this process's to end): its hard
        limit becomes 0, which :meth:`posted` skips (the rest is overwritten by the next
        post)."""
        offset = _HEADER_SIZE + slot * _SLOT
        seq = _SEQ.unpack_from(self._map, offset)[0]
        _SEQ.pack_into(self._map, offset, seq + 1)
        _HARD_AT.pack_into(self._map, offset + _HARD_AT_OFFSET, 0.0)
        _SEQ.pack_into(self._map, offset, seq + 2)
        self._free.append(slot)

    # -- the host's side ------------------------------------------------------------

    def reset(self) -> None:
        """Zero the board for the next process of its slot."""
        self._map[:] = bytes(len(self._map))
        self._free = list(range(self.slots - 1, -1, -1))

    def last_stamp(self, pid: int) -> float | None:
        """When process ``pid`` last stamped the board (None: it has not yet)."""
        magic, owner, stamp = _HEADER.unpack_from(self._map, 0)
        return stamp if magic == _MAGIC and owner == pid else None

    def posted(self) -> list[Posted]:
        """The jobs posted now (a record being written is skipped: it is new)."""
        found = []
        for slot in range(self.slots):
            offset = _HEADER_SIZE + slot * _SLOT
            before = _SEQ.unpack_from(self._map, offset)[0]
            if before % 2:
                continue
            seq, attempt, hard_at, timeout, delay, started_ms, queue, job_id, by = \
                _RECORD.unpack_from(self._map, offset)
            if seq != before or _SEQ.unpack_from(self._map, offset)[0] != before or not hard_at:
                continue
            found.append(Posted(queue.rstrip(b"\0").decode(), job_id.rstrip(b"\0").decode(),
                                attempt, hard_at, timeout, delay, started_ms,
                                by.rstrip(b"\0").decode(errors="replace")))
        return found
