"""Security properties: JSON only, tasks only from the registry, no secrets in output."""

from __future__ import annotations

import ast
import pickle
import signal
import traceback
from pathlib import Path

import pytest

from django_delayq import DelayQConnectionError
from django_delayq.connection import get_broker
from django_delayq.engine.fields import stored
from django_delayq.testing import RedisServer
from tests.conftest import ROOT, wait_until, worker_thread
from tests.testapp.tasks import record

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                  "jsonpickle"}
PASSWORD = "s3cret-pw"


def test_nothing_in_the_package_imports_a_deserializer_that_runs_code():
    found = []
    for path in sorted((ROOT / "django_delayq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n.split(".")[0] in UNSAFE_MODULES]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("eval", "exec", "__import__")):
                found.append(f"{path.relative_to(ROOT)}: {node.func.id}()")
    assert found == []


class _OpensAFile:
    """Unpickling this would create ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_pickle_looking_arguments_are_never_unpickled(redis_client, tmp_path):
    target = tmp_path / "unpickled"
    payload = pickle.dumps(_OpensAFile(target), protocol=0).decode("ascii")
    broker = get_broker()
    keys = broker.shards("default")[0]
    as_text = record.enqueue(payload)
    as_field = record.enqueue("placeholder")
    redis_client.hset(keys.job(as_field.id), stored("args"), payload)
    with worker_thread(queues=["default"]):
        wait_until(lambda: as_text.refresh().is_finished and as_field.refresh().is_finished,
                   message="both jobs to finish")
    assert (as_text.status, as_text.result) == ("completed", payload)
    assert as_field.status == "failed"
    assert "CorruptPayload" in as_field.error
    assert not target.exists()


@pytest.mark.parametrize(("task_name", "args"), [
    ("os.system", ["touch {target}"]),
    ("subprocess.call", [["touch", "{target}"]]),
    ("builtins.open", ["{target}", "w"]),
    ("tests.testapp.fault_tasks._client", []),
    ("django_delayq.worker.Worker", []),
])
def test_a_job_naming_a_function_outside_the_registry_runs_nothing(redis_client, tmp_path,
                                                                  task_name, args):
    target = tmp_path / "ran"
    args = [[a.format(target=target) for a in x] if isinstance(x, list) else
            x.format(target=target) for x in args]
    broker = get_broker()
    keys = broker.shards("default")[0]
    job_id = broker.enqueue("default", task_name, args).job_id
    with worker_thread(queues=["default"]):
        wait_until(lambda: redis_client.hget(keys.job(job_id), stored("status")) == "failed",
                   message="the job to fail")
    error = redis_client.hget(keys.job(job_id), stored("error"))
    assert error.startswith("django_delayq.engine.errors.UnknownTask")
    assert task_name in error
    assert not target.exists()


@pytest.fixture
def protected_redis():
    with RedisServer(extra_args=("--requirepass", PASSWORD)) as server:
        yield server


def secret_url(server: RedisServer, password: str = PASSWORD) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}/0"


def test_the_redis_password_appears_in_no_repr_or_error(settings, protected_redis):
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": secret_url(protected_redis),
                       "SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5}
    job = record.enqueue("with a password")
    broker = get_broker()
    shown = [repr(broker), repr(broker.client), repr(broker.client.connection_pool),
             repr(job), str(job.refresh())]
    assert protected_redis.process is not None
    protected_redis.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(DelayQConnectionError) as frozen:
            record.enqueue("frozen")
    finally:
        protected_redis.process.send_signal(signal.SIGCONT)
    protected_redis.stop()
    with pytest.raises(DelayQConnectionError) as down:
        record.enqueue("down")
    for info in (frozen, down):
        shown += [str(info.value), repr(info.value),
                  "".join(traceback.format_exception(info.value))]
    assert "127.0.0.1" in str(down.value)
    for text in shown:
        assert PASSWORD not in text


def test_a_wrong_password_is_a_connection_error_that_does_not_echo_it(settings,
                                                                      protected_redis):
    wrong = "not-the-" + PASSWORD
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": secret_url(protected_redis, wrong)}
    with pytest.raises(DelayQConnectionError) as info:
        record.enqueue("wrong password")
    text = "".join(traceback.format_exception(info.value))
    assert wrong not in text
    assert PASSWORD not in text


def test_worker_logs_never_show_the_redis_password(spawned, protected_redis):
    url = secret_url(protected_redis)
    proc, out = spawned("default", "-c", "1", "-v", "2", redis_url=url)
    out.wait_for("worker started")
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    from django_delayq.engine import Broker, EngineConfig

    broker = Broker(client, EngineConfig())
    job_id = broker.enqueue("default", record.name, ["logged"]).job_id
    keys = broker.shards("default")[0]
    wait_until(lambda: client.hget(keys.job(job_id), stored("status")) == "completed",
               message=f"job on the protected Redis:\n{out.text}")
    protected_redis.stop()
    out.wait_for("redis unavailable")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert "job completed" in out.text
    assert PASSWORD not in out.text
