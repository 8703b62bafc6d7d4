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
from django.conf import settings
from django.test import override_settings

from django_delayq.engine import PayloadTooLarge
from tests.conftest import ROOT, subprocess_path
from tests.testapp import tasks

DOC = ROOT / "docs" / "testing.md"


def doc_files() -> dict[str, str]:
    """The page's Python blocks whose first line names a file (``# shop/tasks.py``)."""
    blocks = re.findall(r"```python\n# ([\w/.]+\.py)\n(.*?)```", DOC.read_text(), re.S)
    return dict(blocks)


def test_the_docs_example_runs(tmp_path: Path) -> None:
    files = doc_files()
    assert set(files) >= {"shop/tasks.py", "test_shop.py", "settings.py"}
    for name, body in files.items():
        if name == "settings_test.py":
            continue
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = subprocess_path(tmp_path)
    # An installed django-delayq loads the plugin itself; a source checkout names it.
    installed = any(e.name == "django_delayq" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "django_delayq.contrib.pytest"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
         "--ds=settings", "test_shop.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


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
    with override_settings(DELAYQ={"EAGER": "propagate"}), pytest.raises(
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
    (tmp_path / "settings.py").write_text(doc_files()["settings.py"])
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(doc_files()["shop/tasks.py"])
    (tmp_path / "test_leak.py").write_text(LEAK_CHECK)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = subprocess_path(tmp_path)
    installed = any(e.name == "django_delayq" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "django_delayq.contrib.pytest"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         *plugin, "--ds=settings", "test_leak.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
