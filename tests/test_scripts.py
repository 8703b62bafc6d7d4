"""How each Lua script is assembled: its own file after the includes it names."""

from __future__ import annotations

import re

import pytest

from django_delayq.engine import scripts

LUA = scripts.resources.files("django_delayq").joinpath("lua")
FILES = sorted(path.name[:-4] for path in LUA.iterdir() if path.name.endswith(".lua"))
INCLUDES = sorted(path.name[:-4] for path in LUA.joinpath("includes").iterdir()
                  if path.name.endswith(".lua"))
#: Every script: one per file, and the variants loaded from a file with fewer includes.
NAMES = sorted([*FILES, *scripts.VARIANTS])
#: What a script may call without an include: Lua's keywords (a call regex also sees
#: ``if (``) and the globals of Redis's Lua.
BUILTINS = {"and", "or", "not", "if", "elseif", "while", "until", "return", "function",
            "ipairs", "pairs", "pcall", "tonumber", "tostring", "type", "unpack", "error",
            "select", "next", "assert"}
_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_LOCAL = re.compile(r"\blocal\s+(?:function\s+)?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)")
_CALL = re.compile(r"(?<![\w.:])([A-Za-z_]\w*)\s*\(")


def code(source: str) -> str:
    """``source`` without its comments and with its strings emptied: what names they
    mention ('claimed', 'ready', ...) are not uses."""
    source = re.sub(r"--[^\n]*", "", source)
    return re.sub(r"'[^'\n]*'|\"[^\"\n]*\"", "''", source)


def identifiers(source: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code(source)))


def include_text(name: str) -> str:
    return scripts.read_lua(f"includes/{name}.lua")


def defines(text: str) -> set[str]:
    """The names ``text`` defines at its top level."""
    return set(_DEFINITION.findall(text))


#: Which include defines each name.
OWNER = {name: include for include in INCLUDES for name in defines(include_text(include))}


@pytest.mark.parametrize("name", NAMES)
def test_a_script_loads_and_defines_every_function_it_calls(name, redis_client):
    """The source compiles in Redis, and every function it calls is Lua's, Redis's, or
    defined in it (by an include or the script's own code)."""
    script = scripts.load_script(name)
    assert redis_client.script_load(script.source) == script.sha
    if name in scripts.VARIANTS:
        return  # test_the_plain_enqueue_leaves_out_the_workflow_definitions_only
    body = code(script.source)
    local = {n.strip() for names in _LOCAL.findall(body) for n in names.split(",")}
    assert set(_CALL.findall(body)) - local - BUILTINS == set()


@pytest.mark.parametrize("name", [*FILES, *(f"includes/{i}" for i in INCLUDES)])
def test_a_file_names_each_include_it_uses_and_uses_each_it_names(name):
    """A script or include names (``-- include: x``) the include of every definition it
    uses, and uses a definition of every include it names: nothing reaches it by way of
    another include, and no include line is stale."""
    text = scripts.read_lua(f"{name}.lua")
    named = scripts.INCLUDE.findall(text)
    assert len(named) == len(set(named)), "an include named twice"
    used = identifiers(text) - defines(text)
    wanted = {OWNER[n] for n in used if n in OWNER}
    assert wanted <= set(named), f"uses definitions of {wanted - set(named)}"
    unused = [i for i in named if not identifiers(text) & defines(include_text(i))]
    assert unused == []


@pytest.mark.parametrize("name", NAMES)
def test_a_script_uses_everything_it_includes(name):
    """Each definition sent is used by the script or by another definition it keeps:
    no closure made per call for nothing. A claim pays for no workflow code; a plain
    enqueue, for no attempt log."""
    source = scripts.load_script(name).source
    for n in defines(source) & set(OWNER):
        rest = re.sub(rf"^local (function )?{n}\b", "", source, count=1, flags=re.MULTILINE)
        assert n in identifiers(rest), f"{name} includes {n}, which nothing uses"
    assert "resolve_dependant" not in defines(scripts.load_script("claim").source)
    assert "log_attempt" not in defines(scripts.load_script("enqueue").source)


def test_every_include_is_used_and_holds_only_definitions():
    """A statement in an include would run in every script that names it: the includes
    hold definitions and comments only. Every include is some script's."""
    named = {i for name in FILES for i in scripts.includes_of(name)}
    assert named == set(INCLUDES)
    for include in INCLUDES:
        for line in include_text(include).splitlines():
            if not line or line.startswith(("--", " ", "end", "}")):
                continue
            assert re.match(r"local (function )?[A-Za-z_]", line), f"{include}: {line!r}"


def test_includes_come_once_each_after_the_ones_they_name(monkeypatch):
    files = {"s.lua": "-- include: b\n-- include: a\nreturn b()\n",
             "includes/a.lua": "local function a() return 1 end\n",
             "includes/b.lua": "-- include: a\nlocal function b() return a() end\n",
             "loop.lua": "-- include: c\n",
             "includes/c.lua": "-- include: d\n", "includes/d.lua": "-- include: c\n"}
    monkeypatch.setattr(scripts, "read_lua", files.__getitem__)
    assert scripts.includes_of("s") == ["a", "b"]
    assert scripts.includes_of("s", frozenset({"b"})) == ["a"]
    with pytest.raises(ValueError, match="loop -> c -> d -> c"):
        scripts.includes_of("loop")


def test_the_plain_enqueue_leaves_out_the_workflow_definitions_only():
    """``enqueue_plain`` is ``enqueue.lua`` without the workflow includes; the script
    reaches their definitions only for a job that waits (``m > 0``), which is sent as
    ``enqueue``."""
    plain = scripts.load_script("enqueue_plain")
    full = scripts.load_script("enqueue")
    body = scripts.read_lua("enqueue.lua")
    assert plain.source.endswith(body)
    assert plain.sha != full.sha
    left_out = defines(full.source) - defines(plain.source)
    assert {"flow_ctx", "link_parent", "resolve_dependant"} <= left_out
    assert identifiers(body) & set(OWNER) - defines(plain.source) <= left_out
    # Every line of the script's code that names a left-out definition is behind m > 0:
    # the flow context is made only then, and each use is inside `if flow` or in the
    # loop over the jobs that wait.
    uses = [line.strip() for line in code(body).splitlines() if identifiers(line) & left_out]
    assert uses == [
        "local flow = m > 0 and flow_ctx(7 + n, 4 + 10 * n + 5 * m) or nil",
        "local outcome, result = link_parent(flow.prefix, parent_id, '' .. p .. '' .. job_id)",
        "resolve_dependant(flow, job_id, p, outcome, result, parent_id, now)",
        "trim_finished_waiting(flow, now)",
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
