"""Run one workload of one adapter and print one JSON line.

    PYTHONPATH=bench/adapters:. python -m bench.harness rq_bench process '{"url": ..., "n": ...}'

ADAPTER is a module of ``bench/adapters`` imported by its short name, as the workers
import its tasks (``bench.run`` puts that directory on PYTHONPATH). The line is
``{"ok": true, ...figures}`` or ``{"ok": false, "error": ...}``; nothing else goes to
stdout (tracebacks go to stderr, worker logs to ``results/tmp``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any

import redis

from .marks import URL_ENV, redis_url
from .ops import OPS, Adapter


def run(module_name: str, op: str, params: dict[str, Any]) -> dict[str, Any]:
    if "url" in params:
        os.environ[URL_ENV] = params["url"]
    adapter: Adapter | None = None
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            raise RuntimeError(f"no adapter {module_name!r}: is bench/adapters on "
                               "PYTHONPATH?") from None
        adapter = module.make()
        return {"ok": True, **OPS[op](adapter, redis.Redis.from_url(redis_url()), params)}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if adapter is not None:
            try:
                adapter.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    params: dict[str, Any] = json.loads(argv[2]) if len(argv) > 2 else {}
    out = run(argv[0], argv[1], params)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
