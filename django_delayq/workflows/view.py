"""A job's workflow as the admin job page and the API show it: a small tree of its
ancestors and one of its descendants, each job with its live status.

Each level costs one Redis round trip (a pipeline of the level's statuses and links),
so a page reads at most :data:`MAX_DEPTH` levels each way and :data:`MAX_SHOWN` jobs
per direction; what the limits leave out is counted in each job's ``more``.
"""

from __future__ import annotations

from typing import Any

from ..connection import get_broker
from ..engine import Broker
from ..engine import Job as EngineJob
from ..engine.flows import children_of, read_linked

#: Levels of parents (and of dependants) shown: parents, grandparents, great-grandparents.
MAX_DEPTH = 3
#: Jobs shown per direction, over every level (a group's callback may have thousands of
#: parents).
MAX_SHOWN = 100
#: The status of a job Redis no longer holds, and of a reference no key can name.
EXPIRED, INVALID = "expired", "invalid"

Ref = tuple[str, str]


def workflow(queue: str, job_id: str, live: EngineJob | None, row: Any) -> dict[str, Any]:
    """``{"parents": [...], "children": [...], "parents_total": n, "children_total": n}``.

    Each job is a dict of ``queue``, ``job_id``, ``task``, ``status`` (``expired`` once
    Redis no longer holds it), its own ``parents`` (in the first list) or ``children``
    (in the second), and ``more``: how many of those the limits left out. The job's own
    parents come from Redis, else from the mirrored ``row``.
    """
    broker = get_broker()
    if live is not None:
        parents = list(live.parent_refs)
    else:
        parents = [(str(p[0]), str(p[1])) for p in getattr(row, "parents", None) or []
                   if isinstance(p, list | tuple) and len(p) == 2]
    children = children_of(broker, queue, job_id)
    return {"parents": _tree(broker, parents, "parents"),
            "children": _tree(broker, children, "children"),
            "parents_total": len(parents), "children_total": len(children)}


def _tree(broker: Broker, roots: list[Ref], direction: str) -> list[dict[str, Any]]:
    """The jobs ``roots`` and, level by level, their ``direction`` ("parents" or
    "children"), within the limits."""
    budget = MAX_SHOWN
    top = [_node(ref, direction) for ref in roots[:budget]]
    budget -= len(top)
    level = top
    for depth in range(1, MAX_DEPTH + 1):
        links = _read_level(broker, level, direction)
        below: list[dict[str, Any]] = []
        for node, refs in zip(level, links, strict=True):
            shown = refs[:budget] if depth < MAX_DEPTH else []
            node[direction] = [_node(ref, direction) for ref in shown]
            node["more"] = len(refs) - len(shown)
            budget -= len(shown)
            below += node[direction]
        if not below:
            break
        level = below
    return top


def _node(ref: Ref, direction: str) -> dict[str, Any]:
    return {"queue": ref[0], "job_id": ref[1], "task": "", "status": EXPIRED,
            direction: [], "more": 0}


def _read_level(broker: Broker, level: list[dict[str, Any]], direction: str) -> list[list[Ref]]:
    """Fill in the status and task of each job of ``level`` (one round trip); the
    references of each one's ``direction``."""
    found = read_linked(broker, [(node["queue"], node["job_id"]) for node in level],
                        dependants=direction == "children")
    links: list[list[Ref]] = []
    for node, job in zip(level, found, strict=True):
        if job is None:  # a damaged reference: no key can hold that name
            node["status"] = INVALID
            links.append([])
            continue
        node["status"], node["task"] = job.status or EXPIRED, job.task
        links.append(job.links)
    return links
