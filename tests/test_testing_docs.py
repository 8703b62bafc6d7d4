"""docs/testing.md's example runs as written: its files are taken from the page, and
pytest runs them in a fresh process with the plugin (as an installed package loads it)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_delayq.engine import PayloadTooLarge
from django_delayq.testing import RedisServer
from tests.conftest import ROOT, subprocess_path
from tests.testapp import tasks

DOC = ROOT / "docs" / "testing.md"


def doc_files() -> dict[str, str]:
    """The page's Python blocks whose first line names a file (``# shop/tasks.py``)."""
    blocks = re.findall(r"```python\n# ([\w/.]+\.py)\n(.*?)```", DOC.read_text(), re.S)
    return dict(blocks)


def write_project(root: Path, tests: dict[str, str] | None = None) -> None:
    """The page's project (its tasks, settings and tests) in ``root``, plus ``tests``."""
    for name, body in {**doc_files(), **(tests or {})}.items():
        if name == "settings_test.py":
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    (root / "shop" / "__init__.py").write_text("")
    (root / "pytest.ini").write_text("[pytest]\n")


def run_pytest(root: Path, *args: str, **env_changes: str | None) -> str:
    """pytest in a fresh process in ``root``, with the plugin as an installed package
    loads it; ``env_changes`` set (or, when None, remove) environment variables. Returns
    its output; fails on an exit code other than 0 or 1 (1: a test failed)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = subprocess_path(root)
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    # An installed django-delayq loads the plugin itself; a source checkout names it.
    installed = any(e.name == "django_delayq" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "django_delayq.contrib.pytest"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         *plugin, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode in (0, 1), output
    return output


def test_the_docs_example_runs(tmp_path: Path) -> None:
    assert set(doc_files()) >= {"shop/tasks.py", "test_shop.py", "settings.py"}
    write_project(tmp_path)
    output = run_pytest(tmp_path, "--ds=settings", "test_shop.py")
    assert "2 passed" in output, output
    assert "failed" not in output, output


@override_settings(DELAYQ={"EAGER": True})
def test_eager_mode_makes_the_production_checks() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        tasks.record.enqueue(object())
    with override_settings(DELAYQ={"EAGER": True, "MAX_PAYLOAD_BYTES": 100}), pytest.raises(
            PayloadTooLarge):
        tasks.record.enqueue("x" * 200)
    with pytest.raises(ValueError, match="priority"):
        tasks.record.using(priority=1000).enqueue("p")
    job = tasks.add.enqueue(2, 3)
    assert (job.status, job.result, job.attempts) == ("completed", 5, 1)
    bad = tasks.returns_unjsonable.enqueue()
    assert bad.status == "failed"
    assert "not JSON serializable" in bad.error


def test_eager_propagate_raises_the_tasks_error() -> None:
    # The test's own Redis kept: the task notes its run there, and a bare DELAYQ would
    # send that to the default URL, the machine's Redis if one answers.
    with override_settings(DELAYQ={**settings.DELAYQ, "EAGER": "propagate"}), pytest.raises(
            RuntimeError, match="boom eager"):
        tasks.always_fails.enqueue("eager")


def test_eager_sends_nothing_to_redis(redis_client) -> None:
    with override_settings(DELAYQ={**settings.DELAYQ, "EAGER": True}):
        job = tasks.record.enqueue("no redis")
    assert job.status == "completed"
    assert redis_client.dbsize() == 1  # only the note the task itself wrote
    assert redis_client.exists("test:ran")


@override_settings(DELAYQ={"EAGER": True})
def test_eager_runs_an_async_task_to_completion() -> None:
    job = tasks.async_add.enqueue(2, 3)
    assert (job.status, job.error) == ("completed", None)
    assert job.result == {"sum": 5, "in_loop": True}
    assert (job.progress, job.progress_message) == (0.5, "half way")


@override_settings(DELAYQ={"EAGER": True})
def test_eager_runs_an_async_task_from_a_running_event_loop() -> None:
    async def main() -> list[Any]:
        awaited = await tasks.async_add.aenqueue(1, 2)
        called = tasks.async_add.enqueue(3, 4)  # a plain call inside the loop
        return [awaited, called]

    awaited, called = asyncio.run(main())
    assert (awaited.status, awaited.result) == ("completed", {"sum": 3, "in_loop": True})
    assert (called.status, called.result) == ("completed", {"sum": 7, "in_loop": True})
    assert called.progress_message == "half way"


LEAK_CHECK = '''
import pytest
from django.conf import settings as django_settings


def test_changes_settings_after_run_jobs(settings, run_jobs):
    assert run_jobs() == 0
    settings.DELAYQ_PROBE = "changed"  # a change made after run_jobs's own


def test_nothing_is_left_applied():
    assert not hasattr(django_settings, "DELAYQ_PROBE")
    assert django_settings.SETTINGS_MODULE == "settings"
'''


def test_the_plugins_settings_come_off_with_the_tests_own(tmp_path: Path) -> None:
    """A test asking for ``settings`` before ``run_jobs``, then changing a setting: both
    changes are undone in the right order, nothing stays applied for the tests that
    follow (``SETTINGS_MODULE`` of a leaked override holder reads None)."""
    write_project(tmp_path, {"test_leak.py": LEAK_CHECK})
    output = run_pytest(tmp_path, "--ds=settings", "test_leak.py")
    assert "2 passed" in output, output
    assert "failed" not in output, output


GUARD_CHECK = '''
from django.test import override_settings

from django_delayq import Job
from shop.tasks import order_paid


@override_settings(DELAYQ={"EAGER": True})
def test_eager_needs_no_redis():
    assert order_paid(1, "ada@example.com").status == "completed"


def test_forgets_the_fixture():
    job = order_paid(2, "bob@example.com")
    assert Job.fetch(job.id, "emails").id == job.id


def test_asks_for_the_fixture(delayq_redis, run_jobs):
    order_paid(3, "eve@example.com")
    assert run_jobs() == 1


def test_points_at_the_throwaway_redis_itself(delayq_redis_url, settings):
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": delayq_redis_url}
    job = order_paid(4, "joe@example.com")
    assert Job.fetch(job.id, "emails").id == job.id
'''

#: Settings whose Redis is a developer's own (``DEV_REDIS_URL``).
DEV_SETTINGS = """from settings import *  # noqa: F403
import os

DELAYQ = {**DELAYQ, "REDIS_URL": os.environ["DEV_REDIS_URL"]}  # noqa: F405
"""


def test_a_test_without_the_fixture_keeps_off_the_settings_redis(tmp_path: Path) -> None:
    """The settings name a developer's Redis: the test that forgot ``delayq_redis`` fails,
    naming the fixture, before writing there; the eager test needs no Redis; the tests
    with the fixtures run on the plugin's own throwaway Redis. Nothing reaches the
    developer's Redis."""
    write_project(tmp_path, {"test_guard.py": GUARD_CHECK, "dev_settings.py": DEV_SETTINGS})
    with RedisServer() as developers:
        output = run_pytest(tmp_path, "--ds=dev_settings", "test_guard.py",
                            DEV_REDIS_URL=developers.url, DELAYQ_TEST_REDIS_URL=None,
                            REDIS_URL=None)
        assert "1 failed, 3 passed" in output, output
        assert ("test_guard.py::test_forgets_the_fixture used django-delayq's "
                f"Redis ({developers.url}) without asking for one: add the delayq_redis "
                "fixture") in output, output
        with redis.Redis(port=developers.port) as client:
            assert client.info("keyspace") == {}


def test_settings_pointing_at_the_test_redis_opt_in(tmp_path: Path) -> None:
    """Settings that name ``DELAYQ_TEST_REDIS_URL`` (as this suite's do) declare their
    Redis one the tests may empty: a test without the fixture may use it."""
    write_project(tmp_path, {"test_guard.py": GUARD_CHECK, "dev_settings.py": DEV_SETTINGS})
    with RedisServer() as disposable:
        output = run_pytest(tmp_path, "--ds=dev_settings", "test_guard.py",
                            DEV_REDIS_URL=disposable.url, DELAYQ_TEST_REDIS_URL=disposable.url)
    assert "4 passed" in output, output
    assert "failed" not in output, output
