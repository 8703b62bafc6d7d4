"""The transactional outbox: jobs written in a database transaction, sent to Redis after
it commits (see docs/outbox.md).

- :mod:`.write`: :func:`write` (behind ``Task.enqueue_in_transaction``), the
  :class:`OutboxJob` it returns, and the commit hook that sends a transaction's rows;
- :mod:`.send`: sending rows in bulk and settling them (delete, park, count a failure);
- :mod:`.relay`: :class:`Relay`, which sends the rows the commit hook could not, and
  :class:`RelayThread` (the relay on a thread of ``delayq_mirror``, which is
  ``runworker``'s mirror process, or of ``runworker`` without one).
"""

from ..engine.status import OUTBOX
from .relay import Relay, RelayThread, start_relay_threads, stop_relay_threads
from .write import OutboxJob, flush, write

__all__ = ["OUTBOX", "OutboxJob", "Relay", "RelayThread", "flush", "start_relay_threads",
           "stop_relay_threads", "write"]
