"""A producer that stops itself between storing a dependant and linking it.

``python -m tests.stop_before_link SPEC`` (with the test settings in the environment)
enqueues ``flow_collect`` with the job id and the ``(queue, id)`` parents of the JSON
``SPEC``, with every parent's result passed. It stops (SIGSTOP) right after the enqueue
script stored the job, before the links to its parents in other shards are made, so the
test can SIGKILL it at the one moment where a dead producer would strand the job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import django


def main() -> None:
    django.setup()
    from django_delayq.engine import flows
    from tests.testapp import tasks

    link = flows.link

    def stop_first(*args: Any, **kwargs: Any) -> None:
        print("stored the job, stopping before its links", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        link(*args, **kwargs)

    flows.link = stop_first
    spec = json.loads(sys.argv[1])
    tasks.flow_collect.using(job_id=spec["job_id"], pass_results="all",
                             depends_on=[tuple(p) for p in spec["parents"]]).enqueue("c")
    print("enqueued without stopping: it had no parent in another shard", flush=True)


if __name__ == "__main__":
    main()
