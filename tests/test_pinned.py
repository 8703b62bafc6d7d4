"""Single script calls on pinned connections (engine/pinned.py), on a real Redis."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from django_delayq import DelayQConnectionError
from django_delayq.engine import Broker, EngineConfig
from django_delayq.engine.pinned import PinnedConnections
from django_delayq.testing import RedisServer
from tests.testapp.tasks import record


def pinned_client_id(broker: Broker) -> int:
    """The id Redis gives the connection a single call of ``broker`` runs on."""
    assert broker._pinned is not None
    return int(broker._pinned.execute("CLIENT", "ID"))


def evalsha_clients(client: Any) -> set[int]:
    """Ids of the connections whose last command was EVALSHA."""
    return {int(c["id"]) for c in client.client_list() if c["cmd"] == "evalsha"}


def test_single_enqueues_reuse_one_connection(broker):
    record.enqueue("first")  # connects; registers the queue through the pool
    observer = redis.Redis.from_url(os.environ["DELAYQ_TEST_REDIS_URL"],
                                    decode_responses=True)
    ours = pinned_client_id(broker)
    before = {int(c["id"]) for c in observer.client_list()}
    for i in range(300):
        record.enqueue(f"job-{i}")
    clients = {int(c["id"]) for c in observer.client_list()}
    assert clients <= before | {int(observer.client_id())}  # no new connection
    assert ours in evalsha_clients(observer)  # ours ran the scripts...
    assert pinned_client_id(broker) == ours  # ...and is still the one pinned


def test_enqueues_from_many_threads_each_land_once(broker):
    threads, each = 8, 150
    created: list[bool] = []
    errors: list[BaseException] = []

    def produce(t: int) -> None:
        try:
            for i in range(each):
                res = broker.enqueue("q", "t.x", [i], job_id=f"t{t}-{i}")
                created.append(res.added)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert created == [True] * (threads * each)
    assert broker.client.zcard(broker.shards("q")[0].ready) == threads * each


def test_a_forked_child_enqueues_on_its_own_connection(broker):
    record.enqueue("parent")
    parent_id = pinned_client_id(broker)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection id, or the error, then exit
        code = 1
        try:
            record.using(job_id="from-child").enqueue("child")
            os.write(write, str(pinned_client_id(broker)).encode())
            code = 0
        except BaseException as exc:
            os.write(write, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert int(said) != parent_id
    # The parent's connection was left alone: it is in step and still the one used.
    assert record.enqueue("parent again").created
    assert pinned_client_id(broker) == parent_id
    assert broker.client.exists(broker.keys_for(record.queue_name, "from-child").job("from-child"))


def test_script_flush_between_calls_loads_the_script_again(broker):
    record.enqueue("before")
    broker.client.script_flush()
    job = record.enqueue("after")
    assert job.created
    assert job.refresh().status == "ready"


def test_error_replies_and_bad_arguments_keep_the_connection_a_dead_one_is_dropped(broker):
    record.enqueue("warm up")
    first = pinned_client_id(broker)
    assert broker._pinned is not None
    with pytest.raises(ResponseError):
        broker._pinned.execute("NO-SUCH-COMMAND")
    assert pinned_client_id(broker) == first
    with pytest.raises(TypeError):
        broker._pinned.execute("ECHO", object())  # refused before a byte is sent
    assert pinned_client_id(broker) == first
    observer = redis.Redis.from_url(os.environ["DELAYQ_TEST_REDIS_URL"])
    observer.client_kill_filter(_id=first)  # the server closes the pinned socket
    assert record.enqueue("after the kill").created  # through the client path
    assert pinned_client_id(broker) != first  # the dead connection was dropped


def client_for(server: RedisServer, retries: int) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=2,
                                socket_connect_timeout=2, retry=Retry(NoBackoff(), retries))


def test_a_restarted_redis_is_reconnected_to_and_a_stopped_one_raises_clearly():
    with RedisServer(appendonly=True) as server:
        broker = Broker(client_for(server, 2), EngineConfig(prefix="rs"))
        keys = broker.shards("q")[0]
        broker.enqueue("q", "t.x", job_id="before")
        server.restart()
        assert broker.enqueue("q", "t.x", job_id="after-restart").added
        server.stop()
        with pytest.raises(DelayQConnectionError, match="unreachable"):
            broker.enqueue("q", "t.x", job_id="while-down")
        server.start()
        assert broker.enqueue("q", "t.x", job_id="back").added
        assert sorted(broker.client.zrange(keys.ready, 0, -1)) == [
            "after-restart", "back", "before"]
        assert not broker.client.exists(keys.job("while-down"))


def test_without_retries_a_stale_connection_is_still_replaced():
    # The pool's checkout replaces a connection closed by the server without counting a
    # retry; the pinned path does the same by falling back to the client once.
    with RedisServer() as server:
        broker = Broker(client_for(server, 0), EngineConfig(prefix="rs"))
        broker.enqueue("q", "t.x")
        server.restart()
        assert broker.enqueue("q", "t.x", job_id="after-restart").added


def test_only_plain_clients_with_a_roomy_pool_hold_connections(redis_client):
    url = os.environ["DELAYQ_TEST_REDIS_URL"]
    assert PinnedConnections.for_client(redis_client) is not None
    assert PinnedConnections.for_client(redis.Redis.from_url(url, single_connection_client=True)
                                      ) is None
    small = redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, max_connections=2))
    assert PinnedConnections.for_client(small) is None
