"""Starting a SparkSession for django-delayq's commands: local by default, any master.

The master comes from the ``master`` argument, else ``DELAYQ["SPARK_MASTER"]`` when
Django is configured, else ``local[*]``. Local runs get ``SPARK_LOCAL_IP=127.0.0.1``
and ``PYSPARK_PYTHON`` set to this interpreter (unless already set), so executors import
the same django-delayq as the driver.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django_delayq.engine.errors import DelayQError
from django_delayq.engine.logfields import log
from django_delayq.engine.urls import redact

logger = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

#: Defaults for a small local session; any of them can be overridden with ``config``.
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
}


class SparkSetupError(DelayQError, RuntimeError):
    """Spark cannot start here (no Java runtime, say)."""


def resolve_master(master: str | None = None) -> str:
    """The master URL to use: ``master``, else ``DELAYQ["SPARK_MASTER"]``, else local."""
    if master:
        return master
    try:
        from django_delayq.conf import conf

        return conf.SPARK_MASTER
    except Exception:  # Django not installed or not configured: a plain PySpark script
        return DEFAULT_MASTER


def find_java() -> str:
    """The path of the ``java`` Spark will run, or :class:`SparkSetupError` saying why not."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home, "bin", "java")
        if candidate.exists():
            return str(candidate)
        raise SparkSetupError(f"JAVA_HOME is {home!r} but {candidate} does not exist: "
                              "point JAVA_HOME at a Java 17+ runtime or unset it")
    found = shutil.which("java")
    if found:
        return found
    raise SparkSetupError(
        "Spark needs a Java 17+ runtime and none was found (no JAVA_HOME, no java on "
        "PATH): install one (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    )


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "django-delayq",
    config: Mapping[str, Any] | None = None,
) -> Any:
    """Get or create the SparkSession for ``master`` (see :func:`resolve_master`).

    Local masters get :data:`LOCAL_DEFAULTS` (UTC session time zone, few shuffle
    partitions, 1 GiB driver); ``config`` entries win over them. An existing active
    session is returned as it is.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    find_java()
    url = resolve_master(master)
    settings: dict[str, Any] = {}
    if url.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings.update(LOCAL_DEFAULTS)
    settings.update(config or {})
    builder = SparkSession.builder.master(url).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    log(logger, logging.INFO, "starting spark", master=redact(url), app=app_name)
    return builder.getOrCreate()
