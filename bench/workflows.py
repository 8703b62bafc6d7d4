"""Workflows: a group of N members with a callback, and what a waiting job costs, for
django-delayq and for Celery's chord on the same Redis.

    python -m bench.workflows [--scale 1] [--members 10000] [--procs 2] [--threads 8]
                              [--celery bench/.venv-peers/bin/python]

Starts a throwaway Redis and runs, each with its library's interpreter and the
adapters on its path, ``adapters/delayq_flow.py`` (the group, and the bytes of a
waiting job) and, given ``--celery`` (a Python with Celery), ``adapters/celery_chord.py``
(its chord, the same workload). Each prints one JSON line; both go into
``workflows.json`` (in ``--out``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench import record
from bench.harness.marks import URL_ENV
from bench.harness.processes import worker_env
from django_delayq.testing import RedisServer

MEMBERS = 10_000


def run(python: str, module: str, url: str, *args: object) -> dict[str, Any]:
    """Run an adapter script on the Redis at ``url``; its last JSON line."""
    env = worker_env({URL_ENV: url})
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([python, "-m", module, url, *map(str, args)], cwd=str(record.ROOT),
                          env=env, capture_output=True, text=True, timeout=1800, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{module} failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--members", type=int, default=None,
                        help=f"group members (default {MEMBERS:,} x scale)")
    parser.add_argument("--waiting", type=int, default=None,
                        help="jobs for the bytes per waiting job (default: as members)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--celery", help="a Python with Celery: run its chord too")
    opts = parser.parse_args(argv)
    members = opts.members or record.scaled(MEMBERS, opts.scale, 100)
    waiting = opts.waiting or members
    this_run = record.Run("workflows", opts.scale)
    rows = []
    with RedisServer() as server:
        rows.append(run(sys.executable, "delayq_flow", server.url, members, waiting,
                        opts.procs, opts.threads))
        print(json.dumps(rows[-1]), flush=True)
        if opts.celery:
            rows.append(run(opts.celery, "celery_chord", server.url, members, opts.procs,
                            opts.threads))
            print(json.dumps(rows[-1]), flush=True)
    this_run.write(opts.out, {"members": members, "waiting": waiting, "procs": opts.procs,
                              "threads": opts.threads, "rows": rows})


if __name__ == "__main__":
    main()
