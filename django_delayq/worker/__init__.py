"""The worker that ``manage.py runworker`` runs.

- :mod:`.runner`: :class:`Worker`, its threads (fetcher, executors, acker, heartbeat,
  scheduler) and its stop sequence;
- :mod:`.execution`: running one job and turning what happened into an :class:`Outcome`;
- :mod:`.acks`: sending outcomes in batches;
- :mod:`.liveness`: the workers-alive registry in Redis.
"""

from .execution import CorruptPayload, Outcome
from .runner import EXIT_FORCED, EXIT_OK, Worker

__all__ = ["EXIT_FORCED", "EXIT_OK", "CorruptPayload", "Outcome", "Worker"]
