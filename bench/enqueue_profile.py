"""Where a single enqueue's Redis time goes: the enqueue script with each part left out.

    python -m bench.enqueue_profile [--scale 1] [--rounds 6]

One throwaway Redis; the script a plain single enqueue runs (``enqueue_plain``, with the
same KEYS and ARGV ``Commands`` sends for one job) is loaded as it is and as copies with
one part taken out (its event entry, its counter, the wake-up markers, the ZADDs, the
EXISTS check, the job hash, the server clock; and with no body at all, only its
definitions), and a script of the same Redis commands for one plain job with no other Lua
work, beside the floor: ``return 1`` given the same keys and arguments. Each
variant runs a block of jobs with no delay and a block with a delay of a minute, on a
flushed Redis, in alternation (the order reversed every round). A row gives Redis's own
time per call (``INFO commandstats``, ``usec_per_call`` of ``EVALSHA``: the server's time
in the command alone, without the round trip or the client), as the median, lowest and
highest of the rounds, the growth of ``used_memory`` per job and ``MEMORY USAGE`` of the
last job's hash. A part costs what its row saves against ``as it is``; a saving smaller
than the rows' spread is no saving. The copies are for measuring only: each breaks a
guarantee of the script.

Writes ``enqueue_profile.json`` (in ``--out``).
"""

from __future__ import annotations

import statistics
from typing import Any

import redis

from bench import record
from django_delayq.engine import scripts
from django_delayq.engine.commands import Commands, EncodedJob
from django_delayq.engine.config import EngineConfig
from django_delayq.engine.keys import QueueKeys
from django_delayq.engine.requests import new_job_ids
from django_delayq.testing import RedisServer

JOBS = 3_000
ROUNDS = 6
DELAYS = {"now": "", "delay 60 s": 60_000}
#: What each variant takes out of ``enqueue.lua``: (text, its replacement) pairs.
EVENT = "if #new_waiting == 0 then\n  emit_jobs(events, maxlen, 'enqueued', added_ids, now)"
LEFT_OUT: dict[str, list[tuple[str, str]]] = {
    "as it is": [],
    "no event entry (XADD)": [(EVENT, "if #new_waiting == 0 then\n  local _ = 0")],
    "no counter (HINCRBY)": [("redis.call('HINCRBY', KEYS[6 + n], 'e', #added_ids)",
                              "local _ = 0")],
    "no markers": [("add_ready(ready, ready_pairs, marker)", "add_ready(ready, ready_pairs)"),
                   ("redis.call('ZADD', marker, wake_at, '1')", "local _ = 0"),
                   ("local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')",
                    "local head = {0, 0}")],
    "no ZADD to ready/scheduled": [
        ("add_ready(ready, ready_pairs, marker)",
         "if #ready_pairs > 0 then redis.call('ZADD', marker, 0, '0') end"),
        ("call_sliced('ZADD', scheduled, scheduled_pairs)", "local _ = 0")],
    "no EXISTS": [("if redis.call('EXISTS', unpack(KEYS, first, last)) > 0 then",
                   "if false then")],
    "no job hash (HSET)": [("redis.call('HSET', KEYS[5 + i], unpack(fields))",
                            "local _ = fields")],
    "no clock (TIME)": [("local now = now_ms()", "local now = 1700000000000")],
    "hash without 'e' and 'a'": [
        ("local fields = {'t', ARGV[a + 2], 'a', ARGV[a + 3], 'e', now}",
         "local fields = {'t', ARGV[a + 2]}")],
    "one more call (EXISTS)": [("local maxlen = events_cap(ARGV[1])",
                                "redis.call('EXISTS', 'x')\nlocal maxlen = events_cap(ARGV[1])")],
    "definitions only": [("local maxlen = events_cap(ARGV[1])",
                          "do return {} end\nlocal maxlen = events_cap(ARGV[1])")],
}
FLOOR = "EVALSHA of return 1"
#: The Redis commands ``enqueue.lua`` sends for one plain job and nothing else: none of
#: its definitions, tables or checks for other kinds of jobs (and no trimming of the
#: events by bytes). What ``as it is`` costs beyond this row is the script's Lua work.
SAME_COMMANDS = "same commands, no other Lua"
SAME_COMMANDS_SOURCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[4]
if redis.call('EXISTS', KEYS[6]) > 0 then return {0} end
local run_at = now
if ARGV[10] ~= '' then run_at = now + tonumber(ARGV[10]) end
local status = 'ready'
if run_at <= now then
  local seq = redis.call('INCRBY', KEYS[5], 16)
  redis.call('HSET', KEYS[6], 't', ARGV[5], 'a', ARGV[6], 'e', now, 'q', seq, 's', status)
  redis.call('ZADD', KEYS[2], 100 * 35184372088832 + seq, id)
  redis.call('ZADD', KEYS[3], 0, '0')
else
  status = 'scheduled'
  redis.call('HSET', KEYS[6], 't', ARGV[5], 'a', ARGV[6], 'e', now, 'r', run_at, 's', status)
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('ZADD', KEYS[1], run_at, id)
  if head[2] == nil or run_at < tonumber(head[2]) then
    redis.call('ZADD', KEYS[3], run_at, '1')
  end
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 100000, '*', 'event', 'enqueued', 'job', id,
  'ts', now)
redis.call('HINCRBY', KEYS[7], 'e', 1)
return {1, status, run_at, now}
"""


def variant_sources() -> dict[str, str]:
    """The source of each variant of ``enqueue_plain``, and of the floor."""
    file, leave_out = scripts.VARIANTS["enqueue_plain"]
    head = [scripts.read_lua(f"includes/{name}.lua")
            for name in scripts.includes_of(file, leave_out)]
    body = scripts.read_lua(f"{file}.lua")
    sources = {}
    for name, swaps in LEFT_OUT.items():
        text = body
        for old, new in swaps:
            assert old in text, f"{name}: enqueue.lua no longer has {old!r}"
            text = text.replace(old, new)
        sources[name] = "\n".join([*head, text])
    assert sources["as it is"] == scripts.load_script("enqueue_plain").source
    sources[SAME_COMMANDS] = SAME_COMMANDS_SOURCE
    sources[FLOOR] = "return 1"
    return sources


def job_call(job_id: str, delay: int | str) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV ``Commands`` sends to enqueue one plain job."""
    job = EncodedJob(job_id, "bench.noop", "[]", "{}", 0, "", delay, 1, "")
    return Commands(None, EngineConfig())._enqueue_call(QueueKeys("dq", "bench"), [job])


def block(client: Any, sha: str, calls: list[tuple[list[str], list[Any]]]) -> dict[str, Any]:
    """Run ``calls`` (each job's KEYS and ARGV) after a flush and 200 untimed ones."""
    client.flushall()
    for keys, args in calls[:200]:
        client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    before = client.info("memory")["used_memory"]
    client.config_resetstat()
    for keys, args in calls[200:]:
        client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    stats = client.info("commandstats")["cmdstat_evalsha"]
    grown = client.info("memory")["used_memory"] - before
    assert stats["calls"] == len(calls) - 200
    return {"usec_per_call": stats["usec_per_call"], "bytes_per_job": grown / stats["calls"],
            "hash_bytes": client.memory_usage(calls[-1][0][5])}


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    opts = parser.parse_args(argv)
    jobs = record.scaled(JOBS, opts.scale, 50) + 200
    this_run = record.Run("enqueue_profile", opts.scale)
    ids = new_job_ids(jobs)
    sources = variant_sources()
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        shas = {name: client.script_load(source) for name, source in sources.items()}
        for index in range(opts.rounds):
            order = list(sources) if index % 2 == 0 else list(reversed(sources))
            for name in order:
                for when, delay in DELAYS.items():
                    calls = [job_call(next(ids), delay) for _ in range(jobs)]
                    found.setdefault((name, when), []).append(block(client, shas[name], calls))
        version = client.info("server")["redis_version"]
    rows = []
    for (name, when), runs in found.items():
        usec = [run["usec_per_call"] for run in runs]
        rows.append({"row": name, "when": when, "usec_per_call": statistics.median(usec),
                     "usec_low": min(usec), "usec_high": max(usec),
                     "bytes_per_job": round(statistics.median(
                         run["bytes_per_job"] for run in runs), 1),
                     "hash_bytes": runs[-1]["hash_bytes"]})
    this_run.write(opts.out, {"jobs": jobs - 200, "rounds": opts.rounds,
                              "redis": version, "rows": rows})
    for row in rows:
        print(f"{row['row']:28} {row['when']:11} {row['usec_per_call']:6.2f} µs "
              f"({row['usec_low']:.2f}-{row['usec_high']:.2f}) {row['bytes_per_job']:7.1f} B/job "
              f"hash {row['hash_bytes']}")


if __name__ == "__main__":
    main()
