"""A job's workflow as the admin job page and the API show it: its parents and its
dependants, each with its live status (one Redis round trip for the statuses)."""

from __future__ import annotations

from typing import Any

from ..connection import get_broker
from ..engine import Job as EngineJob
from ..engine.fields import stored
from ..engine.flows import children_of

#: Parents or dependants shown at most (a group's callback may have thousands).
MAX_SHOWN = 100


def workflow(queue: str, job_id: str, live: EngineJob | None, row: Any) -> dict[str, Any]:
    """``{"parents": [...], "children": [...], "parents_total": n, "children_total": n}``;
    each job a dict of ``queue``, ``job_id``, ``task`` and ``status`` (``expired`` once
    Redis no longer holds it). Parents come from Redis, else from the mirrored ``row``."""
    broker = get_broker()
    if live is not None:
        parents = list(live.parent_refs)
    else:
        parents = [(str(p[0]), str(p[1])) for p in getattr(row, "parents", None) or []
                   if isinstance(p, list | tuple) and len(p) == 2]
    children = children_of(broker, queue, job_id)
    shown = parents[:MAX_SHOWN] + children[:MAX_SHOWN]
    pipe = broker.client.pipeline(transaction=False)
    for q, i in shown:
        pipe.hmget(broker.keys_for(q, i).job(i), stored("status"), stored("task"))
    with broker.connection_errors():
        found = pipe.execute() if shown else []
    jobs = [{"queue": q, "job_id": i, "status": status or "expired", "task": task or ""}
            for (q, i), (status, task) in zip(shown, found, strict=True)]
    n = min(len(parents), MAX_SHOWN)
    return {"parents": jobs[:n], "children": jobs[n:], "parents_total": len(parents),
            "children_total": len(children)}
