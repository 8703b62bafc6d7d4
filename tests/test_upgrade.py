"""Upgrades: jobs written by the previous release run on this code, and jobs written by
this code run on the previous release's workers (a rolling upgrade, both versions
against one Redis and one database), with the migrations applied on a filled database.

The previous release is a pinned commit of this repository (:data:`PREVIOUS`), taken
out with ``git archive`` into a directory of its own (or, in a shallow clone without that
commit, from :data:`STORED`: the same files as ``git archive`` gives them); its processes
import its ``django_delayq`` and its test project (``tests.settings``, ``tests.testapp``)
from there.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from django_delayq import Job
from django_delayq.engine.fields import FORMAT
from django_delayq.mirror import Mirror
from django_delayq.models import Job as JobRow
from tests.conftest import ROOT, kill_with_children, sqlite_rows, wait_until, worker_env
from tests.testapp import tasks

#: The previous release, 0.1.0 (CHANGELOG.md).
PREVIOUS = "c779230"
PREVIOUS_VERSION = "0.1.0"
#: The package and the test project of :data:`PREVIOUS`:
#: ``git archive --format=tar.gz c779230 django_delayq tests/__init__.py tests/settings.py
#: tests/urls.py tests/testapp``.
STORED = ROOT / "tests" / "fixtures" / "release-0.1.0.tar.gz"

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

#: Run by either version (their APIs are the same here): a job waiting, one delayed,
#: one retrying (its first attempt failed, the retry due later), a chain whose child
#: waits for its delayed parent; `extra` adds lines. Prints the job ids as JSON.
PRODUCE = """
import json
import django
django.setup()
from django_delayq import chain
from django_delayq.connection import get_broker
from tests.testapp import tasks

broker = get_broker()
ids = {{}}
retried = tasks.record.using(max_attempts=3).enqueue("{tag}-retried")
(claimed,) = broker.claim("default", 1, "{tag}-worker")[0].jobs
assert claimed.id == retried.id
batch = broker.batch()
broker.add_fail(batch, claimed.keys, claimed.id, claimed.attempt, "RuntimeError: once", "",
                8000)
batch.run()
ids["retried"] = retried.id
ids["ready"] = tasks.record.enqueue("{tag}-ready").id
ids["delayed"] = tasks.record.using(delay=8).enqueue("{tag}-delayed").id
parent, child = chain(tasks.flow_step.using(delay=6).bind(10, tag="{tag}-parent"),
                      tasks.flow_step.bind(tag="{tag}-child"), pass_results=True).enqueue()
ids["parent"], ids["child"] = parent.id, child.id
{extra}
import django_delayq
print(json.dumps({{"ids": ids, "code": django_delayq.__file__}}))
"""

#: What this version writes that the previous one did not: a job with a traceparent.
TRACED = """
ids["traced"] = broker.enqueue(
    "default", tasks.record.name, ["new-traced"],
    traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").job_id
"""

#: What the previous version writes after this version's migrations, while both run: a
#: job through its outbox (a column this version added must not fail its INSERT).
OUTBOXED = """
import json
import django
django.setup()
from django.db import transaction
from tests.testapp import tasks

with transaction.atomic():
    job = tasks.record.enqueue_in_transaction("late-outboxed")
print(json.dumps({"outboxed": job.id}))
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's tree."""
    tree = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS],
                             capture_output=True, timeout=120, check=False)
    if archive.returncode == 0:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
    else:  # a shallow clone, or an sdist: the stored copy
        with tarfile.open(STORED) as tar:
            tar.extractall(tree, filter="data")
    return tree


def env_of(tree: Path, db: str) -> dict[str, str]:
    """The environment of a process of the version in ``tree``, on the test's Redis."""
    env = worker_env(DELAYQ_TEST_SQLITE=db)
    env["PYTHONPATH"] = str(tree)
    return env


def run(tree: Path, db: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=tree, env=env_of(tree, db),
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"{args} in {tree}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def produce(tree: Path, db: str, tag: str, extra: str = "") -> dict[str, str]:
    out = json.loads(run(tree, db, "-c", PRODUCE.format(tag=tag, extra=extra)).strip()
                     .splitlines()[-1])
    assert Path(out["code"]).is_relative_to(tree), out["code"]  # that version's code
    ids: dict[str, str] = out["ids"]
    # read back by this version, whoever wrote them
    status = {name: Job.fetch(job_id).status for name, job_id in ids.items()}
    assert status["retried"] == "scheduled"
    assert Job.fetch(ids["retried"]).attempts == 1
    assert status["delayed"] == status["parent"] == "scheduled"
    assert status["child"] == "waiting"
    return ids


def worker(tree: Path, db: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "django", "runworker", "default"],
                            cwd=tree, env=env_of(tree, db), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)


def all_ran(ids: dict[str, str], db: str) -> None:
    """Every job completed (in Redis, and in the mirrored rows), the chain in order."""
    wait_until(lambda: all(Job.fetch(i).status == "completed" for i in ids.values()),
               timeout=120, message="the jobs to complete")
    assert Job.fetch(ids["retried"]).attempts == 2
    assert Job.fetch(ids["parent"]).result == 11
    assert Job.fetch(ids["child"]).result == 12
    wait_until(lambda: all(sqlite_rows(db).get(i) == "completed" for i in ids.values()),
               timeout=120, message="the rows to be mirrored")


def test_jobs_of_the_previous_release_run_here_and_back(previous: Path, tmp_path: Path,
                                                         redis_client: Any) -> None:
    db = str(tmp_path / "jobs.sqlite3")
    here = ROOT
    # the previous release: its schema, its jobs, its rows
    run(previous, db, "-m", "django", "migrate", "-v0")
    old_jobs = produce(previous, db, "old")
    run(previous, db, "-m", "django", "delayq_mirror", "--burst")
    assert set(old_jobs.values()) <= set(sqlite_rows(db))
    # upgrade: this version's migrations on the filled database, its worker on old jobs
    run(here, db, "-m", "django", "migrate", "-v0")
    # a producer of the previous version still running
    old_jobs |= json.loads(run(previous, db, "-c", OUTBOXED).strip().splitlines()[-1])
    new_worker = worker(here, db)
    try:
        all_ran(old_jobs, db)
    finally:
        kill_with_children(new_worker)
    # a rolling upgrade: what this version writes, a worker of the previous one runs
    new_jobs = produce(here, db, "new", TRACED)
    old_worker = worker(previous, db)
    try:
        all_ran(new_jobs, db)
    finally:
        kill_with_children(old_worker)


def test_a_job_or_event_of_a_newer_format_is_never_misread(broker: Any, redis_client: Any,
                                                           caplog: Any) -> None:
    job = tasks.record.enqueue("format")
    keys = broker.keys_for("default", job.id)
    assert redis_client.hget(keys.job(job.id), "fv") is None  # format 1 stores none
    assert Job.fetch(job.id).damaged == {}
    redis_client.hset(keys.job(job.id), "fv", FORMAT + 1)
    assert Job.fetch(job.id).damaged == {"format": f"{FORMAT + 1} (this version reads 1)"}
    redis_client.xadd(keys.events, {"event": "enqueued", "job": "from-the-future", "ts": 1,
                                    "fv": FORMAT + 1})
    Mirror(block=0.1).run(burst=True)
    assert not JobRow.objects.filter(job_id="from-the-future").exists()
    assert "event format 2 is newer than this version reads (1)" in caplog.text


def test_the_package_and_its_metadata_name_one_version() -> None:
    import tomllib

    import django_delayq

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == django_delayq.__version__
    assert f"[{PREVIOUS_VERSION}]" in (ROOT / "CHANGELOG.md").read_text()
