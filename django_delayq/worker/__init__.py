"""The worker that ``manage.py runworker`` runs.

- :mod:`.runner`: :class:`Worker`, which puts the parts below together, and its stop
  sequence;
- :mod:`.ledger`: the leases the worker holds, the one state its threads share;
- :mod:`.fetcher`: claiming jobs for free threads and the buffer;
- :mod:`.executor`: the threads running jobs;
- :mod:`.execution`: running one job and turning what happened into an :class:`Outcome`;
- :mod:`.acks`: the acker, sending outcomes in batches;
- :mod:`.heartbeat`: lease renewal, reclaim and liveness;
- :mod:`.timelimits`: the watchdog raising and enforcing jobs' time limits;
- :mod:`.exit_codes`: what the exit codes mean;
- :mod:`.children`: child processes kept running (the pool's, and the mirror's);
- :mod:`.supervisor`: the process pool of ``runworker --processes N``;
- :mod:`.mirror_process`: a single ``runworker``'s mirror, in a child process;
- :mod:`.recycle`: a worker process's job and memory limits;
- :mod:`.async_executor`: ``async def`` tasks on the process's event loop thread;
- :mod:`.health`: is a worker alive (``delayq_health``);
- the workers-alive registry in Redis is :mod:`django_delayq.engine.workers`.
"""

from .execution import CorruptPayload, Outcome
from .exit_codes import EXIT_FORCED, EXIT_OK, EXIT_RESTART
from .runner import Worker

__all__ = ["EXIT_FORCED", "EXIT_OK", "EXIT_RESTART", "CorruptPayload", "Outcome", "Worker"]
