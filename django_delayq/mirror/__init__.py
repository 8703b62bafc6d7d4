"""The model mirror: events streams in Redis -> :class:`django_delayq.models.Job` rows.

- :mod:`.consumer`: :class:`Mirror` (the consumer-group reader and its batched upserts),
  run by ``manage.py delayq_mirror`` (a child process of ``runworker`` by default);
- :mod:`.events`: one stream entry -> the events it holds, and an event -> a row.

The mirror is the one writer of the ``django_delayq_job`` table.
"""

from .consumer import Mirror, table_exists
from .takeover import GROUP

__all__ = ["GROUP", "Mirror", "table_exists"]
