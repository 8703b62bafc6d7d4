"""The sdist is complete: built from this tree, installed as a user installs it, and a
representative part of its own tests passes against the installed package."""

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
          "tests/pg_server.py", "tests/servers.py", "constraints.txt",
          "tests/testapp/__init__.py", "tests/testapp/tasks.py", "tests/test_task.py",
          "tests/test_bench_smoke.py", "bench/run.py", "bench/report.py",
          "bench/harness/ops.py", "bench/harness/lua/done.lua", "bench/targets.json",
          "docs/testing.md", "docs/api.md", "CHANGELOG.md", "README.md", "LICENSE",
          "Makefile", "pyproject.toml", "requirements-dev.txt", "example_project/demo.py",
          "django_delayq/lua/claim.lua", "django_delayq/contrib/pytest.py",
          "django_delayq/testing.py", "django_delayq/templates/admin/django_delayq/queues.html"]

#: The tests run from the sdist, chosen for what a sdist can lack (package data, entry
#: points): tasks (the Lua scripts and their includes), the admin's pages (its templates
#: and static files), the API's pages and the testing docs' example (which loads the
#: pytest plugin through its entry point). The rest of the suite runs on the tree.
SAMPLE = ["tests/test_task.py", "tests/test_api_pages.py", "tests/test_testing_docs.py",
          *(f"tests/test_admin.py::{name}" for name in (
              "test_dashboard_shows_counts_state_throughput_and_workers",
              "test_job_page_shows_arguments_result_timings_traceback_and_live_state",
              "test_pause_resume_and_purge_with_confirmation"))]

#: A pytest plugin that writes down where the tests' django_delayq was imported from.
PROBE = """import os

def pytest_sessionfinish(session):
    import django_delayq

    with open(os.environ["DELAYQ_PROBE_OUT"], "w") as out:
        out.write(django_delayq.__file__)
"""


def build_sdist(out: Path) -> Path:
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_sdist(sys.argv[1]))", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return out / build.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(1500)  # a pip install and a pytest, each bounded at 600 s
def test_sdist_installs_and_its_tests_pass_against_the_installed_package(
        tmp_path: Path) -> None:
    sdist = build_sdist(tmp_path / "dist")
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
        missing = [path for path in NEEDED if path not in members]
        assert not missing, f"the sdist lacks {missing}"
        assert not [m for m in members if m.startswith(("test-artifacts", ".venv",
                                                        "bench/results", "bench/.venv"))
                    or "__pycache__" in m or m.endswith(".png")]
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / sdist.name.removesuffix(".tar.gz")

    # Installed as pip installs it: built from the sdist, with its package data.
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-cache-dir", "--target", str(site), str(sdist)],
        capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    assert (site / "django_delayq" / "lua" / "includes" / "now_ms.lua").is_file()
    assert list(site.glob("django_delayq-*.dist-info/entry_points.txt"))

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "delayq_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DELAYQ_TEST_REDIS_URL", "REDIS_URL")}
    # The installed package first, then the unpacked tree (for its tests package only);
    # the shared virtualenv gives the dependencies. -P and an empty pythonpath keep
    # Python and pytest from putting the tree (and its django_delayq) first.
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(probe), str(src)])
    env["DELAYQ_PROBE_OUT"] = str(tmp_path / "imported-from")
    run = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
         "pythonpath=", "-p", "delayq_probe", *SAMPLE],
        cwd=src, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
    assert " skipped" not in run.stdout, run.stdout[-2000:]
    imported = Path((tmp_path / "imported-from").read_text())
    assert imported.is_relative_to(site), imported  # the installed package ran, not the tree
