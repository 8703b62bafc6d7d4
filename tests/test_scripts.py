"""How each Lua script is assembled: its own file after the include definitions it uses."""

from __future__ import annotations

import re

import pytest

from django_delayq.engine import scripts

FILES = sorted(path.stem for path in scripts.resources.files("django_delayq").joinpath(
    "lua").iterdir() if path.name.endswith(".lua"))
#: Every script: one per file, and the variants loaded from a file with fewer includes.
NAMES = sorted([*FILES, *scripts.VARIANTS])
#: Every name the includes define at their top level.
DEFINED = [name for name, _ in scripts._definitions()]
#: The names the workflow include defines.
FLOWS = {name for name, _ in scripts._definitions(("includes/flows.lua",))}


def defined_in(source: str) -> set[str]:
    """The include names ``source`` defines at its top level."""
    return {n for n in DEFINED if re.search(rf"^local (function )?{n}\b", source, re.MULTILINE)}


def identifiers(source: str) -> set[str]:
    code = re.sub(r"--[^\n]*", "", source)  # comments name functions without calling them
    code = re.sub(r"'[^'\n]*'", "''", code)  # so do strings: 'claimed', 'ready', ...
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))


@pytest.mark.parametrize("name", FILES)
def test_a_script_defines_every_include_it_uses_before_it_runs(name, redis_client):
    """Each include name the script's code uses is defined in its source, before the
    script's own file; the source loads (compiles) in Redis."""
    script = scripts.load_script(name)
    body = scripts._read(f"{name}.lua")
    prelude = script.source[:-len(body)]
    assert script.source.endswith(body)
    assert identifiers(script.source) & set(DEFINED) <= defined_in(prelude)
    assert redis_client.script_load(script.source) == script.sha


def test_a_script_leaves_out_the_includes_it_never_uses():
    """A claim of a batch pays for no workflow or histogram code; the enqueue script, for
    no attempt log. Whatever a script defines, its own code or another definition it
    keeps uses (no closure made per call for nothing)."""
    batch_claim = scripts.load_script("batch_claim").source
    enqueue = scripts.load_script("enqueue").source
    assert "local function resolve_dependant" not in batch_claim
    assert "local function observe" not in batch_claim
    assert "local function log_attempt" not in enqueue
    assert "local function resolve_dependant" in enqueue  # it links waiting jobs
    for name in NAMES:
        source = scripts.load_script(name).source
        for n in defined_in(source):
            rest = re.sub(rf"^local (function )?{n}\b", "", source, count=1, flags=re.MULTILINE)
            assert n in identifiers(rest), f"{name}.lua keeps {n}, which nothing uses"


def test_the_includes_hold_only_definitions_and_their_comments():
    """A statement between two definitions would run only in the scripts that keep the
    definition before it: the includes hold none (each definition runs to the next)."""
    for path in scripts.INCLUDES:
        for line in scripts._read(path).splitlines():
            if not line or line.startswith(("--", " ", "end", "}")):
                continue
            assert re.match(r"local (function )?[A-Za-z_]", line), f"{path}: {line!r}"


def test_the_plain_enqueue_leaves_out_the_workflow_definitions_only():
    """``enqueue_plain`` is ``enqueue.lua`` with every definition it uses but those of the
    workflow include (and what only they use); the script reaches those only for a job
    that waits (``m > 0``), which is sent as ``enqueue``."""
    plain = scripts.load_script("enqueue_plain")
    full = scripts.load_script("enqueue")
    body = scripts._read("enqueue.lua")
    assert plain.source.endswith(body)
    assert plain.sha != full.sha
    prelude = plain.source[:-len(body)]
    assert defined_in(prelude) & FLOWS == set()
    assert identifiers(body) & set(DEFINED) - defined_in(prelude) <= FLOWS
    # Every line of the script's code that names a workflow definition is behind m > 0:
    # the flow context is made only then, and each use is inside `if flow` or in the
    # loop over the jobs that wait.
    uses = [line.strip() for line in re.sub(r"--[^\n]*", "", body).splitlines()
            if identifiers(line) & FLOWS]
    assert uses == [
        "local flow = m > 0 and flow_ctx(7 + n, 3 + 9 * n + 5 * m) or nil",
        "local outcome, result = link_parent(flow.prefix, parent_id, 'L ' .. p .. ' ' .. job_id)",
        "resolve_dependant(flow, job_id, p, outcome, result, parent_id, now)",
    ]


def test_jobs_that_wait_for_no_parent_are_sent_without_the_workflow_code(redis_client):
    """A plain enqueue (single or bulk) runs ``enqueue_plain``; one with a job that waits
    runs ``enqueue``, which links it."""
    from django_delayq import Job
    from tests.testapp import tasks

    plain, full = (scripts.load_script(n).sha for n in ("enqueue_plain", "enqueue"))
    redis_client.script_flush()
    parent = tasks.record.using(delay=600).enqueue("p")
    tasks.record.enqueue_many([("a",), ("b",)])
    assert redis_client.script_exists(plain, full) == [True, False]
    child = tasks.record.using(depends_on=[parent]).enqueue("c")
    assert redis_client.script_exists(full) == [True]
    assert Job.fetch(child.id, child.queue).status == "waiting"
