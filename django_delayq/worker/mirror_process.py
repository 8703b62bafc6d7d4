"""The model mirror of a single ``runworker``, in a child process of its own.

Writing the Job table costs CPU, and in the worker's process that CPU is taken from
the jobs (about 40 % of a no-op job's throughput). So ``runworker`` (without
``--processes``, whose supervisor has its own mirror child) starts ``manage.py
delayq_mirror`` as its child, kept running by the same code as the pool's children
(:class:`.children.Children`: restarted with backoff if it dies), and stops it once the
worker has acked everything: the mirror then writes what is left (at most 5 s, the
events of a ``--burst`` run included) and exits. If ``runworker`` dies, the mirror
sees its stdin end and stops the same way.

It consumes as ``<worker name>/mirror``: its pending events are taken over at once by
other mirrors when the worker is gone, and a restarted child re-reads them first.
"""

from __future__ import annotations

import logging
import os
import threading

from ..engine.workers import mirror_consumer
from .children import KILL_AFTER, MIRROR, Child, Children

logger = logging.getLogger("django_delayq.worker")

#: Seconds the mirror may take to write what is left after the worker stopped (its own
#: drain is capped at 5 s; the rest is its start-up, if it was not up yet), before it is
#: stopped at once.
STOP_WAIT = 15.0


class MirrorProcess:
    """A ``delayq_mirror`` child of this process, kept running on a thread."""

    def __init__(self, worker_name: str, *, verbosity: int = 1) -> None:
        argv = ["delayq_mirror", "--drain-on-stop", "--stop-on-eof",
                "--name", mirror_consumer(worker_name), "--supervisor-pid", str(os.getpid()),
                "-v", str(verbosity)]
        self.children = Children([Child(MIRROR, 0, argv)], name=worker_name)
        self._thread = threading.Thread(target=self.children.run, name="delayq-mirror-child",
                                        daemon=True)

    def start(self) -> MirrorProcess:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Let the mirror write what is left and exit; stopped at once after
        :data:`STOP_WAIT` seconds."""
        self.children.request_stop()
        self._thread.join(STOP_WAIT)
        if self._thread.is_alive():
            logger.warning("the mirror process did not stop within %.0fs: stopping it now",
                           STOP_WAIT)
            self.children.request_stop()
            self._thread.join(KILL_AFTER + 5)
