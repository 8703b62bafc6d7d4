"""``bench/outbox.py`` end to end on a tiny scale, so it cannot rot (no timing asserted).

It runs on the PostgreSQL server of the tests (tests/services.py), in a database of its
own that it creates and drops.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import services

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.postgres
def test_the_outbox_bench_reports_every_figure():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DELAYQ_BENCH_PG"] = ":".join(services.pg_conninfo())  # the suite's server
    done = subprocess.run(
        [sys.executable, "bench/outbox.py", "--transactions", "5", "--rows", "20",
         "--samples", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for label in ("an INSERT alone (no job)", "INSERT + enqueue_on_commit",
                  "INSERT + enqueue_in_transaction (hook sends)",
                  "INSERT + enqueue_in_transaction (no hook)"):
        assert re.search(rf"{re.escape(label)}\s+\d+ us/transaction", done.stdout), output
    assert re.search(r"relay of those 5 rows .*rows/s", done.stdout), output
    assert re.search(r"20 rows waiting: first job in Redis after [\d,]+ ms, all after",
                     done.stdout), output
    assert re.search(r"over 2 samples: p50 [\d,]+ ms", done.stdout), output
