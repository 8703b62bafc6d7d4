"""A standalone Spark cluster for the tests: one master and two workers, on free ports.

Started from the PySpark installation itself (``bin/spark-class`` runs the master and
worker classes), so it needs nothing but Java and the ``spark`` extra. The executors it
launches run this interpreter with the project on ``PYTHONPATH`` and no Django settings:
what a real cluster with django-delayq installed (and not the Django project) looks like.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.servers import quiet_port

ROOT = Path(__file__).resolve().parent.parent


def executor_pythonpath() -> str:
    """The project and this environment's site-packages, for the executors' Python.

    Spark starts the executors' Python through the interpreter's resolved path, which
    leaves a virtualenv's site-packages out: name them, as an image with django-delayq
    installed would have them.
    """
    import site

    return os.pathsep.join([str(ROOT), *site.getsitepackages()])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class SparkCluster:
    """``with SparkCluster(workers=2) as cluster:`` then ``cluster.master_url``."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "768m") -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        # The JVM binds them seconds later: ports no outgoing connection can take meanwhile.
        self.port = quiet_port()
        self.web_port = quiet_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dir = Path(tempfile.mkdtemp(prefix="delayq-spark-"))

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DJANGO_SETTINGS_MODULE", "PYSPARK_DRIVER_PYTHON")}
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.dir / "logs"),
            "SPARK_WORKER_DIR": str(self.dir / "work"),
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": executor_pythonpath(),
        })
        return env

    def _start(self, name: str, *args: str) -> None:
        with (self.dir / f"{name}.log").open("wb") as log:  # the process keeps its own
            self.procs.append(subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                env=self._env(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
            ))

    def start(self, timeout: float = 120.0) -> SparkCluster:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.web_port))
        for i in range(self.workers):
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                        "--host", "127.0.0.1", "--cores", str(self.cores),
                        "--memory", self.memory, "--webui-port", str(quiet_port()),
                        self.master_url)
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the Spark cluster did not come up ({self.alive_workers()} of "
                    f"{self.workers} workers registered; exited: {dead}); logs in {self.dir}")
            time.sleep(0.2)
        return self

    def state(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/",
                                    timeout=2) as page:
            return dict(json.load(page))

    def alive_workers(self) -> int:
        try:
            return int(self.state().get("aliveworkers", 0))
        except OSError:
            return 0

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
