"""The transactional outbox: jobs written in a database transaction, sent to Redis after
it commits (see docs/outbox.md).

- :mod:`.write`: :func:`write` (behind ``Task.enqueue_in_transaction``), the
  :class:`OutboxJob` it returns, and the commit hook that sends a transaction's rows;
- :mod:`.send`: sending rows in bulk and settling them (delete, park, count a failure);
- :mod:`.relay`: :class:`Relay`, which sends the rows the commit hook could not (a
  service of every ``runworker``'s host, and ``manage.py delayq_relay``).
"""

from ..engine.status import OUTBOX
from .relay import Relay
from .write import OutboxJob, flush, write

__all__ = ["OUTBOX", "OutboxJob", "Relay", "flush", "write"]
