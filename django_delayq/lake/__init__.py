"""The job-history lake: every queue's events, appended to date-partitioned Parquet files.

:class:`~.export.Exporter` reads each events stream through its own consumer group
(:data:`~.export.GROUP`, apart from the mirror's) and acknowledges entries only once the
file holding them is durable; :mod:`.store` writes those files, named by the stream ids
they hold, to a local path or any filesystem URL PyArrow can write. The Spark reader is
:mod:`django_delayq.spark.lake`. See docs/lake.md.
"""

from __future__ import annotations

from .export import GROUP, Exporter, ExportThread
from .schema import ARROW_SCHEMA

__all__ = ["ARROW_SCHEMA", "GROUP", "ExportThread", "Exporter"]
