"""No Redis password in a check message, a repr or Django's debug page, and the example
project keeps its debug page off unless asked."""

from __future__ import annotations

import os
import runpy
from collections.abc import Iterator

import pytest
from django.views.debug import SafeExceptionReporterFilter

from django_delayq.connection import get_broker
from django_delayq.engine.urls import redact as redact_url
from django_delayq.testing import RedisServer
from tests.conftest import ROOT, system_checks
from tests.testapp.tasks import record

PASSWORD = "s3cret-check-pw"


@pytest.mark.parametrize(("url", "shown"), [
    (f"http://:{PASSWORD}@host:6379/0", "http://:***@host:6379/0"),
    (f"redis://user:{PASSWORD}@host/0", "redis://user:***@host/0"),
    (f"redis://{PASSWORD}@host/0", "redis://***@host/0"),
    (f"redis://host/0?password={PASSWORD}&db=2", "redis://host/0?password=***&db=2"),
    (f"unix:///tmp/r.sock?password={PASSWORD}", "unix:///tmp/r.sock?password=***"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ({"password": PASSWORD}, "<dict>"),
])
def test_redact_url_masks_every_password(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize(("key", "value", "check_id"), [
    ("REDIS_URL", f"http://:{PASSWORD}@host:6379/0", "django_delayq.E002"),
    ("REDIS_URL", f"redis//:{PASSWORD}@host", "django_delayq.E002"),
    ("SPARK_MASTER", f"http://u:{PASSWORD}@spark:7077", "django_delayq.E060"),
])
def test_check_messages_never_show_the_password(settings, key, value, check_id):
    settings.DELAYQ = {**settings.DELAYQ, key: value}
    errors = [e for e in system_checks() if e.id == check_id]
    assert len(errors) == 1
    assert PASSWORD not in errors[0].msg
    assert PASSWORD not in str(errors[0])


def test_the_spark_plan_repr_has_no_url():
    from django_delayq.spark.partition import EnqueuePlan

    plan = EnqueuePlan(redis_url=f"redis://:{PASSWORD}@h:6379/0", task="t")
    assert PASSWORD not in repr(plan)


def test_djangos_debug_page_filter_shows_delayq_redis_url_but_hides_cache_passwords(settings):
    """What docs/guarantees.md says: Django hides settings whose name matches API, AUTH,
    TOKEN, KEY, SECRET, PASS or SIGNATURE, at any depth; ``REDIS_URL`` does not match, so
    a password kept in it shows on the debug page. A django-redis cache whose
    ``OPTIONS["PASSWORD"]`` holds it (``DELAYQ["CACHE_ALIAS"]``) is hidden."""
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": f"redis://:{PASSWORD}@h:6379/0"}
    assert PASSWORD in str(SafeExceptionReporterFilter().get_safe_settings()["DELAYQ"])
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": "redis://h:6379/0"}
    settings.CACHES = {**settings.CACHES, "jobs": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://h:6379/0",
        "OPTIONS": {"PASSWORD": PASSWORD}}}
    shown = str(SafeExceptionReporterFilter().get_safe_settings())
    assert PASSWORD not in shown
    assert "django_redis.cache.RedisCache" in shown


@pytest.fixture
def protected_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=("--requirepass", PASSWORD)) as server:
        yield server


def test_a_cache_alias_with_options_password_connects(settings, protected_redis):
    settings.CACHES = {**settings.CACHES, "jobs": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://127.0.0.1:{protected_redis.port}/0",
        "OPTIONS": {"PASSWORD": PASSWORD}}}
    settings.DELAYQ = {**settings.DELAYQ, "CACHE_ALIAS": "jobs"}
    job = record.enqueue("through the cache alias")
    assert job.refresh().status == "ready"
    assert get_broker().client.ping()
    assert PASSWORD not in str(SafeExceptionReporterFilter().get_safe_settings())


@pytest.mark.parametrize(("env", "debug"), [({}, False), ({"DJANGO_DEBUG": "1"}, True),
                                            ({"DJANGO_DEBUG": "true"}, False)])
def test_the_example_project_debug_is_off_unless_asked(monkeypatch, env, debug):
    monkeypatch.delenv("DJANGO_DEBUG", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = os.path.join(ROOT, "example_project", "mysite", "settings.py")
    assert runpy.run_path(path)["DEBUG"] is debug
