"""The model mirror: events streams in Redis -> :class:`django_delayq.models.Job` rows.

- :mod:`.consumer`: :class:`Mirror` (the consumer-group reader and its batched upserts)
  and :class:`MirrorThread` (the mirror on a thread of ``runworker``);
- :mod:`.events`: one stream entry -> the events it holds, and an event -> a row.

The mirror is the one writer of the ``django_delayq_job`` table.
"""

from .consumer import Mirror, MirrorThread, table_exists
from .takeover import GROUP

__all__ = ["GROUP", "Mirror", "MirrorThread", "table_exists"]
