"""System checks of ``settings.DELAYQ``: every bad value has its own check id."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tests.conftest import system_checks


def ids(**delayq):
    with override_settings(DELAYQ=delayq):
        return sorted({m.id for m in system_checks() if m.id.startswith("django_delayq.")})


def test_valid_settings_pass():
    assert ids(REDIS_URL="rediss://:pw@cache.example:6380/2", SHARDS={"emails": 4}) == []
    assert ids(MIRROR_RETENTION=None, MIRROR_BATCH_SIZE=100, MIRROR_CLAIM_IDLE=0) == []


@pytest.mark.parametrize(("delayq", "expected"), [
    ({"REDIS_URL": "http://x"}, "django_delayq.E002"),
    ({"CACHE_ALIAS": "missing"}, "django_delayq.E003"),
    ({"SOCKET_TIMEOUT": 0}, "django_delayq.E004"),
    ({"SOCKET_CONNECT_TIMEOUT": "2"}, "django_delayq.E005"),
    ({"PREFIX": "a{b}"}, "django_delayq.E006"),
    ({"DEFAULT_QUEUE": ""}, "django_delayq.E007"),
    ({"MAX_ATTEMPTS": 0}, "django_delayq.E008"),
    ({"RETRY_BACKOFF": -1}, "django_delayq.E009"),
    ({"RETRY_BACKOFF_MAX": None}, "django_delayq.E010"),
    ({"LEASE": 0.01}, "django_delayq.E011"),
    ({"CONCURRENCY": 1.5}, "django_delayq.E012"),
    ({"GRACE_PERIOD": -5}, "django_delayq.E013"),
    ({"BLOCK_TIMEOUT": 0}, "django_delayq.E014"),
    ({"RESULT_TTL": "1d"}, "django_delayq.E015"),
    ({"FAILED_TTL": -1}, "django_delayq.E016"),
    ({"KEEP_COMPLETED": -1}, "django_delayq.E017"),
    ({"KEEP_FAILED": True}, "django_delayq.E018"),
    ({"EVENTS_MAXLEN": 1.5}, "django_delayq.E019"),
    ({"MAX_PAYLOAD_BYTES": -1}, "django_delayq.E020"),
    ({"SHARDS": {"q": 0}}, "django_delayq.E021"),
    ({"NOT_A_SETTING": 1}, "django_delayq.E022"),
    ({"MIRROR_RETENTION": -1}, "django_delayq.E030"),
    ({"MIRROR_BATCH_SIZE": 0}, "django_delayq.E031"),
    ({"MIRROR_CLAIM_IDLE": "1m"}, "django_delayq.E032"),
])
def test_each_bad_setting_has_its_check(delayq, expected):
    assert ids(**delayq) == [expected]


def test_delayq_must_be_a_dict():
    with override_settings(DELAYQ=["REDIS_URL"]):
        assert [m.id for m in system_checks() if m.id.startswith("django_delayq.")] == [
            "django_delayq.E001"]


def test_every_setting_has_a_check_id_of_its_own():
    from collections import Counter

    from django_delayq.conf import SETTINGS

    shared = {cid: n for cid, n in Counter(row.check_id for row in SETTINGS.values()).items()
              if n > 1}
    assert shared == {}


def test_cluster_with_a_sentinel_url_is_refused_with_what_to_do_and_no_password():
    sentinel = "redis+sentinel://:hunter2@h1:26379,h2:26379/mymaster/0"
    with override_settings(DELAYQ={"REDIS_URL": sentinel, "CLUSTER": True}):
        (message,) = [m for m in system_checks() if m.id.startswith("django_delayq.")]
    assert message.id == "django_delayq.E024"
    assert "Sentinel serves one primary and its replicas, not a Cluster" in message.msg
    assert "redis+cluster://" in message.msg
    assert "hunter2" not in message.msg
    assert ids(REDIS_URL=sentinel, CLUSTER=False) == []
    assert ids(REDIS_URL="redis+cluster://h1:7000,h2:7001/0", CLUSTER=True) == []


def test_a_cluster_client_for_a_sentinel_url_is_refused():
    from django_delayq.engine.urls import client_from_url

    with pytest.raises(ValueError, match="not a Redis Cluster"):
        client_from_url("redis+sentinel://h1:26379/mymaster/0", cluster=True)
