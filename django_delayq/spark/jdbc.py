"""The mirrored job table read through Spark's JDBC source, on the executors.

The ORM loader (:func:`~django_delayq.spark.history.jobs_from_orm`) reads every row on
the driver, over one database connection, into the driver's memory. This loader hands
Spark a JDBC URL and the table's id range instead: Spark splits the range into
``num_partitions`` slices and each executor reads its slice over its own connection, so
the read scales with the cluster and the driver holds no rows.

The driver only asks the database (through Django) for the table name, the connection
settings and ``MIN(id)``/``MAX(id)``. The JDBC driver is a jar that the Spark session must
load (``spark.jars`` or ``spark.jars.packages``): :func:`driver_jar` finds a local one.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .history import FIELDS, HISTORY_SCHEMA, filter_since

#: The Maven coordinates of PostgreSQL's JDBC driver, for ``spark.jars.packages``.
POSTGRES_PACKAGE = "org.postgresql:postgresql:42.7.4"
#: Where distributions install that jar (Debian's and Ubuntu's libpostgresql-jdbc-java).
POSTGRES_JAR_GLOBS = ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-*.jar")
#: Environment variable naming the jar (a path, or several separated by commas).
JAR_ENV = "DELAYQ_JDBC_JAR"
#: Rows per executor slice the reader aims at when the partition count is not given.
ROWS_PER_PARTITION = 250_000

_DRIVERS = {"postgresql": "org.postgresql.Driver"}


class JdbcUnavailable(ValueError):
    """The job table cannot be read through JDBC (a database without a JDBC URL here)."""


@dataclass(frozen=True)
class JdbcSource:
    """Where and how Spark reads the job table. ``properties`` hold the credentials."""

    url: str
    table: str
    driver: str
    properties: dict[str, str] = field(default_factory=dict, repr=False)


def jdbc_source(alias: str = "default") -> JdbcSource:
    """The job table of Django database ``alias`` as a JDBC source (PostgreSQL only).

    Raises :class:`JdbcUnavailable` for other databases.
    """
    from django.db import connections

    from django_delayq.models import Job

    conn = connections[alias]
    return source_from_settings(conn.vendor, conn.settings_dict, Job._meta.db_table,
                                alias=alias)


def source_from_settings(vendor: str, params: Mapping[str, Any], table: str, *,
                         alias: str = "default") -> JdbcSource:
    """A JDBC source from one ``settings.DATABASES`` entry: host, port, name, user,
    password and the ``sslmode`` option."""
    if vendor not in _DRIVERS:
        raise JdbcUnavailable(
            f"database {alias!r} is {vendor}: the JDBC reader supports PostgreSQL; "
            "read the table through the ORM instead (delayq_report --source orm)")
    host = params.get("HOST") or "localhost"
    if host.startswith("/"):
        raise JdbcUnavailable(f"database {alias!r} is reached through a Unix socket "
                              f"({host}), which JDBC cannot use: give it a TCP host")
    port = params.get("PORT") or "5432"
    url = f"jdbc:postgresql://{host}:{port}/{params['NAME']}"
    properties = {"user": str(params.get("USER") or "")}
    if params.get("PASSWORD"):
        properties["password"] = str(params["PASSWORD"])
    sslmode = (params.get("OPTIONS") or {}).get("sslmode")
    if sslmode:
        properties["sslmode"] = str(sslmode)
    return JdbcSource(url=url, table=table, driver=_DRIVERS[vendor], properties=properties)


def driver_jar() -> str | None:
    """A local JDBC driver jar: ``$DELAYQ_JDBC_JAR``, else one a package installed."""
    given = os.environ.get(JAR_ENV)
    if given:
        return given
    for pattern in POSTGRES_JAR_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def spark_config() -> dict[str, str]:
    """Session settings that load the driver: the local jar, else the Maven package."""
    jar = driver_jar()
    return {"spark.jars": jar} if jar else {"spark.jars.packages": POSTGRES_PACKAGE}


def id_range(alias: str = "default") -> tuple[int, int, int]:
    """``(min id, max id, rows)`` of the job table (zeros when it is empty)."""
    from django.db.models import Count, Max, Min

    from django_delayq.models import Job

    found = Job.objects.using(alias).aggregate(lo=Min("id"), hi=Max("id"), n=Count("id"))
    if not found["n"]:
        return 0, 0, 0
    return int(found["lo"]), int(found["hi"]), int(found["n"])


def jobs_from_jdbc(spark: SparkSession, *, since: dt.timedelta | None = None,
                   alias: str = "default", num_partitions: int | None = None,
                   fetch_size: int = 10_000) -> DataFrame:
    """The mirrored jobs as a DataFrame read by the executors, one id slice each.

    ``num_partitions`` defaults to one slice per :data:`ROWS_PER_PARTITION` rows, and at
    least the session's default parallelism. Columns and types are those of
    :data:`~django_delayq.spark.history.HISTORY_SCHEMA`.
    """
    source = jdbc_source(alias)
    lo, hi, rows = id_range(alias)
    if not rows:
        return filter_since(spark.createDataFrame([], HISTORY_SCHEMA), since)
    if num_partitions is None:
        num_partitions = max(spark.sparkContext.defaultParallelism,
                             -(-rows // ROWS_PER_PARTITION))
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be 1 or more, not {num_partitions}")
    reader = (spark.read.format("jdbc")
              .option("url", source.url)
              .option("dbtable", source.table)
              .option("driver", source.driver)
              .option("partitionColumn", "id")
              .option("lowerBound", str(lo))
              .option("upperBound", str(hi + 1))
              .option("numPartitions", str(min(num_partitions, hi - lo + 1)))
              .option("fetchsize", str(fetch_size)))
    for key, value in source.properties.items():
        reader = reader.option(key, value)
    raw = reader.load()
    df = raw.select(*[F.col(name).cast(dtype).alias(name) for name, dtype, _ in FIELDS])
    return filter_since(df, since)


def describe(source: JdbcSource) -> dict[str, Any]:
    """The source without its credentials, for logs and messages."""
    return {"url": source.url, "table": source.table, "driver": source.driver,
            "user": source.properties.get("user", "")}
