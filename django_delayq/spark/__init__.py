"""The Spark pipeline: bulk scheduling from DataFrames and job-history analytics.

Needs the ``spark`` extra (PySpark, PyArrow, Matplotlib) and a Java runtime::

    pip install 'django-delayq[spark]'

``enqueue_dataframe`` turns the rows of a DataFrame into jobs from the Spark executors,
through the engine alone (executors need no Django). ``load_jobs``, ``jobs_from_orm`` and
``jobs_from_jdbc`` read the job history into a DataFrame (``jobs_from_lake`` and
``attempts_from_lake`` from the job-history lake) and ``build_report`` summarises
it per queue and task. See docs/spark.md.
"""

from __future__ import annotations

from ..engine.errors import ExtraMissing

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ExtraMissing("django_delayq.spark", "PySpark", "spark",
                       " (and a Java 17+ runtime)") from exc

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Loaded on first use: executors import only the modules their work needs.
_EXPORTS = {
    "EnqueueSummary": "enqueue",
    "RejectedRow": "enqueue",
    "enqueue_dataframe": "enqueue",
    "export_jobs": "history",
    "jobs_from_file": "history",
    "attempts_from_lake": "lake",
    "jobs_from_jdbc": "jdbc",
    "jobs_from_lake": "lake",
    "jobs_from_orm": "history",
    "load_jobs": "history",
    "Report": "report",
    "build_report": "report",
    "SparkSetupError": "session",
    "resolve_master": "session",
    "spark_session": "session",
}

__all__ = [
    "EnqueueSummary",
    "RejectedRow",
    "Report",
    "SparkSetupError",
    "attempts_from_lake",
    "build_report",
    "enqueue_dataframe",
    "export_jobs",
    "jobs_from_file",
    "jobs_from_jdbc",
    "jobs_from_lake",
    "jobs_from_orm",
    "load_jobs",
    "resolve_master",
    "spark_session",
]

if TYPE_CHECKING:
    from .enqueue import EnqueueSummary, RejectedRow, enqueue_dataframe
    from .history import export_jobs, jobs_from_file, jobs_from_orm, load_jobs
    from .jdbc import jobs_from_jdbc
    from .lake import attempts_from_lake, jobs_from_lake
    from .report import Report, build_report
    from .session import SparkSetupError, resolve_master, spark_session


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_delayq.spark' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
