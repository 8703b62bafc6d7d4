"""The Django admin of django-delayq (autodiscovered as ``django_delayq.admin``).

- :mod:`.jobs`: the mirrored job list and job page, with their actions;
- :mod:`.dashboard`: the queues dashboard (live counts, pause, purge, workers);
- :mod:`.outbox`: the jobs waiting in the transactional outbox, parked ones with their error.
"""

from .dashboard import QueuesDashboardAdmin
from .jobs import JobAdmin
from .outbox import OutboxEntryAdmin

__all__ = ["JobAdmin", "OutboxEntryAdmin", "QueuesDashboardAdmin"]
