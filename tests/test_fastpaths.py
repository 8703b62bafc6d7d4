"""The fast paths of engine/fastpaths.py: each gives the answer of the path it skips.

``tox -e redis5,redis6,redis7,redislatest`` runs this file and test_pinned.py on each
redis-py major version the package allows (the pinned connections use its internals).
"""

from __future__ import annotations

import ast
import inspect
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import redis
from hiredis import pack_command

from django_delayq import DelayQConnectionError
from django_delayq.engine import Broker, EngineConfig
from django_delayq.engine.fastpaths import (
    REDIS_PY_CONNECTION_METHODS,
    arg_shape,
    checkout,
    disconnect,
    must_reconnect,
    positional_names,
    read_reply,
    retries,
    send_on_open_socket,
    send_packed,
)
from django_delayq.engine.pinned import PinnedConnections


def plain(a, b, c=3, d=4): ...
def no_params(): ...
def star_args(a, *rest): ...
def keyword_only(a, *, b): ...
def positional_only(a, /, b): ...


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3, 4), {}), ((1, 2, 3, 4, 5), {}),
    ((1,), {"b": 2}), ((), {"a": 1, "b": 2, "d": 0}), ((1, 2), {"a": 1}),
    ((1, 2), {"e": 5}), ((), {"b": 2}), ((1, 2), {"c": 3, "d": 4}),
]


@pytest.mark.parametrize("func", [plain, no_params, star_args, keyword_only, positional_only])
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_an_argument_shape_never_accepts_what_signature_bind_refuses(func, args, kwargs):
    shape = arg_shape(func)
    try:
        inspect.signature(func).bind(*args, **kwargs)
        binds = True
    except TypeError:
        binds = False
    if shape is not None:
        assert shape.accepts(args, kwargs) == binds  # exact where a shape exists


def test_only_plain_parameter_lists_get_a_shape():
    assert arg_shape(plain) is not None
    assert arg_shape(no_params) is not None
    assert arg_shape(star_args) is arg_shape(keyword_only) is arg_shape(positional_only) is None
    assert positional_names(positional_only) == ("a", "b")
    assert positional_names(keyword_only) == ("a",)


def test_the_redis_py_internals_the_pinned_connections_use_work():
    client = redis.Redis.from_url(os.environ["DELAYQ_TEST_REDIS_URL"], decode_responses=True)
    pool = client.connection_pool
    conn = checkout(pool)
    try:
        for method in REDIS_PY_CONNECTION_METHODS:
            assert callable(getattr(conn, method)), method
        send_packed(conn, [pack_command(("ECHO", "héllo"))])
        assert read_reply(conn) == "héllo"  # decoded as the client would
        assert isinstance(retries(conn), int)
        assert retries(conn) >= 0
        assert must_reconnect(conn) is False
        send_on_open_socket(conn, [pack_command(("ECHO", "1")), pack_command(("ECHO", "2"))])
        assert [read_reply(conn), read_reply(conn)] == ["1", "2"]
        disconnect(conn)
        with pytest.raises(redis.ConnectionError, match="closed with replies due"):
            send_on_open_socket(conn, [pack_command(("ECHO", "lost"))])  # never reconnects
        send_packed(conn, [pack_command(("ECHO", "again"))])  # connects again
        assert read_reply(conn) == "again"
    finally:
        pool.release(conn)
    pinned = PinnedConnections.for_client(client)
    assert pinned is not None
    assert pinned.execute("ECHO", "again") == "again"
    pinned.close()
    client.close()


def test_only_the_fastpaths_module_reaches_redis_py_internals():
    """The redis-py internals the pinned connections need (connection methods, pool
    checkout, retry count) and a cluster's node table are reached in
    engine/fastpaths.py alone, so a redis-py upgrade that moves one is met in one place."""
    package = Path(__file__).resolve().parent.parent / "django_delayq"
    internals = {"send_packed_command", "read_response", "should_reconnect",
                 "get_connection", "get_retries", "_retries", "nodes_manager", "_sock"}
    offenders = []
    for path in package.rglob("*.py"):
        if path.relative_to(package).as_posix() == "engine/fastpaths.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in internals:
                offenders.append(f"{path.relative_to(package)}:{node.lineno} {node.attr}")
    assert offenders == []


def test_the_enqueue_fast_path_still_reports_an_unreachable_redis():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = redis.Redis(port=port, decode_responses=True, socket_connect_timeout=0.5)
    broker = Broker(client, EngineConfig())
    assert broker._pinned is not None  # the single enqueue takes the pinned path
    with pytest.raises(DelayQConnectionError, match="unreachable"):
        broker.enqueue("default", "tasks.x", [1])
