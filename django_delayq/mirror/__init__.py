"""The model mirror: events streams in Redis -> :class:`django_delayq.models.Job` rows.

- :mod:`.consumer`: :class:`Mirror`, the sink of the stream consumer
  (:mod:`django_delayq.runtime.consumer`) that writes rows, a service of every
  ``runworker``'s host and ``manage.py delayq_mirror``;
- :mod:`.events`: one stream entry -> the events it holds, and an event -> a row;
- :mod:`.table`: the only writer of the ``django_delayq_job`` table.
"""

from .consumer import GROUP, Mirror, table_exists

__all__ = ["GROUP", "Mirror", "table_exists"]
