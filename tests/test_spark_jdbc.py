"""The JDBC reader's set-up, on the default (SQLite) settings.

The reads themselves need PostgreSQL and a cluster: ``tests/test_spark_cluster.py`` runs
``tests/pg_spark_jdbc.py`` for them.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayq.spark import jdbc

pytestmark = pytest.mark.spark

PG = {
    "ENGINE": "django.db.backends.postgresql", "HOST": "db.internal", "PORT": "6432",
    "NAME": "shop", "USER": "reporter", "PASSWORD": "s3cret-pw",
    "OPTIONS": {"sslmode": "require"},
}


def test_sqlite_has_no_jdbc_source_and_the_command_says_so() -> None:
    with pytest.raises(jdbc.JdbcUnavailable, match="supports PostgreSQL"):
        jdbc.jdbc_source()
    with pytest.raises(CommandError, match="read the table through the ORM instead"):
        call_command("delayq_report", source="jdbc")
    with pytest.raises(CommandError, match="--partitions must be 1 or more"):
        call_command("delayq_report", partitions=0)


def test_a_postgresql_source_carries_the_settings_but_never_shows_the_password() -> None:
    source = jdbc.source_from_settings("postgresql", PG, "django_delayq_job")
    assert source.url == "jdbc:postgresql://db.internal:6432/shop"
    assert source.table == "django_delayq_job"
    assert source.driver == "org.postgresql.Driver"
    assert source.properties == {"user": "reporter", "password": "s3cret-pw",
                                 "sslmode": "require"}
    assert "s3cret" not in repr(source)
    assert "s3cret" not in str(jdbc.describe(source))
    bare = jdbc.source_from_settings("postgresql", {"NAME": "shop"}, "t")
    assert (bare.url, bare.properties) == ("jdbc:postgresql://localhost:5432/shop",
                                           {"user": ""})


def test_a_unix_socket_host_is_refused_with_the_reason() -> None:
    with pytest.raises(jdbc.JdbcUnavailable, match="Unix socket"):
        jdbc.source_from_settings("postgresql", {**PG, "HOST": "/var/run/postgresql"}, "t")


def test_the_driver_jar_comes_from_the_environment_then_the_system(monkeypatch) -> None:
    monkeypatch.setenv(jdbc.JAR_ENV, "/opt/jars/pg.jar")
    assert jdbc.driver_jar() == "/opt/jars/pg.jar"
    assert jdbc.spark_config() == {"spark.jars": "/opt/jars/pg.jar"}
    monkeypatch.delenv(jdbc.JAR_ENV)
    monkeypatch.setattr(jdbc, "POSTGRES_JAR_GLOBS", ("/nonexistent/*.jar",))
    assert jdbc.driver_jar() is None
    assert jdbc.spark_config() == {"spark.jars.packages": jdbc.POSTGRES_PACKAGE}
