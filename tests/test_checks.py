"""System checks of ``settings.DELAYQ``: every bad value has its own check id."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tests.conftest import system_checks


def ids(**delayq):
    with override_settings(DELAYQ=delayq):
        return sorted({m.id for m in system_checks() if m.id.startswith("django_delayq.")})


def test_valid_settings_pass():
    assert ids(REDIS_URL="rediss://:pw@cache.example:6380/2",
               QUEUES={"emails": {"shards": 4}}) == []
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
    ({"RESULT_MAX_BYTES": -1}, "django_delayq.E130"),
    ({"EVENTS_MAX_BYTES": 1.5}, "django_delayq.E131"),
    ({"ERROR_MAX_BYTES": 10}, "django_delayq.E132"),
    ({"PROGRESS_MAX_BYTES": -1}, "django_delayq.E133"),
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


def messages(**delayq):
    with override_settings(DELAYQ=delayq):
        return [m for m in system_checks() if m.id.startswith("django_delayq.")]


def test_cluster_flag_is_refused_with_the_url_to_write_and_no_password():
    (message,) = messages(REDIS_URL="redis://:hunter2@h1:7000/0", CLUSTER=True)
    assert message.id == "django_delayq.E024"
    assert "Write \"REDIS_URL\": 'redis+cluster://:***@h1:7000/0'" in message.msg
    assert "delete CLUSTER" in message.msg
    assert "hunter2" not in message.msg
    sentinel = "redis+sentinel://:hunter2@h1:26379,h2:26379/mymaster/0"
    (message,) = messages(REDIS_URL=sentinel, CLUSTER=True)
    assert (message.id, "hunter2" in message.msg) == ("django_delayq.E024", False)
    assert [m.id for m in messages(CLUSTER=False)] == ["django_delayq.E024"]
    assert ids(REDIS_URL="redis+cluster://h1:7000,h2:7001/0") == []


def test_shards_setting_is_refused_with_the_queues_to_write():
    (message,) = messages(SHARDS={"a": 2, "b": 3}, QUEUES={"b": {"shards": 5, "interval": 1}})
    assert message.id == "django_delayq.E021"
    expected = {"b": {"shards": 5, "interval": 1}, "a": {"shards": 2}}
    assert f"Write \"QUEUES\": {expected!r} and delete SHARDS." in message.msg
    # what it says to write passes every check
    assert ids(QUEUES=expected) == []


def test_replaced_settings_are_refused_when_the_engine_config_is_built(settings):
    from django.core.exceptions import ImproperlyConfigured

    from django_delayq.connection import engine_config

    settings.DELAYQ = {**settings.DELAYQ, "SHARDS": {"q": 2}}
    with pytest.raises(ImproperlyConfigured, match=r"Write \"QUEUES\": \{'q': \{'shards': 2\}\}"):
        engine_config()


# -- one table ------------------------------------------------------------------------

def test_the_engine_config_of_the_defaults_is_the_bare_engines(settings):
    from django_delayq.connection import engine_config
    from django_delayq.engine import EngineConfig

    settings.DELAYQ = {"REDIS_URL": settings.DELAYQ["REDIS_URL"]}
    assert engine_config() == EngineConfig()


def test_every_engine_setting_reaches_its_field(settings):
    from dataclasses import fields

    from django_delayq.conf import SETTINGS, EngineSetting
    from django_delayq.connection import engine_config
    from django_delayq.engine import EngineConfig
    from django_delayq.engine.config import OPTIONS

    given = {"PREFIX": "other", "LEASE": 12.5, "EVENTS_MAXLEN": 7, "RESULT_TTL": 60,
             "FAILED_TTL": 120.25, "KEEP_COMPLETED": 3, "KEEP_FAILED": 4,
             "MAX_PAYLOAD_BYTES": 999, "RESULT_MAX_BYTES": 998, "EVENTS_MAX_BYTES": 997,
             "ERROR_MAX_BYTES": 996, "PROGRESS_MAX_BYTES": 995,
             "QUEUES": {"q": {"shards": 2}}, "MIN_REPLICAS": 1,
             "MIN_REPLICAS_TIMEOUT": 0.5, "MIN_REPLICAS_ACKS": True, "FAILOVER_RETRY": 2}
    assert set(given) == set(OPTIONS), "a case for each engine setting"
    assert {n for n, row in SETTINGS.items() if isinstance(row, EngineSetting)} == set(OPTIONS)
    settings.DELAYQ = {**settings.DELAYQ, **given}
    config, default = engine_config(), EngineConfig()
    assert ids(**given) == []
    expected = {"prefix": "other", "lease_ms": 12_500, "events_maxlen": 7,
                "result_ttl_ms": 60_000, "failed_ttl_ms": 120_250, "keep_completed": 3,
                "keep_failed": 4, "max_payload_bytes": 999, "result_max_bytes": 998,
                "events_max_bytes": 997, "error_max_bytes": 996, "progress_max_bytes": 995,
                "queues": {"q": {"shards": 2}},
                "min_replicas": 1, "min_replicas_timeout_ms": 500, "min_replicas_acks": True,
                "failover_retry_ms": 2_000}
    assert {f.name: getattr(config, f.name) for f in fields(config)
            if f.init and getattr(config, f.name) != getattr(default, f.name)} == expected
    assert dict(config.shards) == {"q": 2}


DOCS = "https://github.com/django-delayq/django-delayq/blob/main/docs/"
TABLE_START = "<!-- the settings table"
TABLE_END = "<!-- end of the settings table -->"


def settings_table() -> str:
    """The README's settings table, as the settings table of conf.py gives it."""
    from django_delayq.conf import SETTINGS

    lines = ["| setting | default | unit | meaning |", "|---|---|---|---|"]
    for name, row in SETTINGS.items():
        lines.append(f"| `{name}` | `{row.default!r}` | {row.unit} | "
                     f"{row.doc.replace('](docs/', f']({DOCS}')} |")
    return "\n".join(lines)


def test_readme_lists_every_setting_with_its_default_from_the_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = readme.index(TABLE_START)
    start = readme.index("\n", start) + 1
    shown = readme[start:readme.index(TABLE_END)].strip()
    expected = settings_table()
    assert shown == expected, f"replace the README's settings table with:\n\n{expected}\n"
