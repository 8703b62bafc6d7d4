"""The job-history lake: every queue's events, appended to date-partitioned Parquet files.

:class:`~.export.Exporter` reads each events stream through its own consumer group
(:data:`~.export.GROUP`, apart from the mirror's) and acknowledges entries only once the
file holding them is durable; :mod:`.store` writes those files, named by the stream ids
they hold, to a local path or any filesystem URL PyArrow can write. The Spark reader is
:mod:`django_delayq.spark.lake`. See docs/lake.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .export import GROUP, Exporter
    from .schema import ARROW_SCHEMA

__all__ = ["ARROW_SCHEMA", "GROUP", "Exporter"]

#: Where each name lives. They load on first use: they need PyArrow (the ``spark``
#: extra), and ``runworker`` imports :mod:`.runner` from this package without it.
_HOMES = {"ARROW_SCHEMA": ".schema", "GROUP": ".export", "ExportThread": ".export",
          "Exporter": ".export"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
