"""The sdist is complete: built from this tree, unpacked, a part of its own tests runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

NEEDED = ["tests/conftest.py", "tests/settings.py", "tests/urls.py", "tests/services.py",
          "tests/pg_server.py",
          "tests/testapp/__init__.py", "tests/testapp/tasks.py", "tests/test_task.py",
          "docs/testing.md", "docs/api.md", "CHANGELOG.md", "README.md", "LICENSE",
          "Makefile", "pyproject.toml", "requirements-dev.txt", "example_project/demo.py",
          "django_delayq/lua/claim.lua", "django_delayq/contrib/pytest.py",
          "django_delayq/templates/admin/django_delayq/queues.html"]


def test_sdist_holds_and_runs_its_tests(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_sdist(sys.argv[1]))", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    name = build.stdout.strip().splitlines()[-1]
    with tarfile.open(out / name) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
        missing = [path for path in NEEDED if path not in members]
        assert not missing, f"the sdist lacks {missing}"
        assert not [m for m in members if m.startswith(("test-artifacts", ".venv"))
                    or "__pycache__" in m]
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / name.removesuffix(".tar.gz")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(src)
    # Its own throwaway Redis (the sdist's tests start one), not this session's.
    env.pop("DELAYQ_TEST_REDIS_URL", None)
    env.pop("REDIS_URL", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/test_task.py"],
        cwd=src, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
    assert str(src) in subprocess.run(
        [sys.executable, "-c", "import django_delayq; print(django_delayq.__file__)"],
        cwd=src, env=env, capture_output=True, text=True).stdout  # its own code ran
