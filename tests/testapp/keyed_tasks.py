"""Tasks with concurrency and dedupe keys: each measures how many of its key run at once."""

from __future__ import annotations

import json
import time

from django_delayq import task
from django_delayq.connection import get_broker

#: HASH key -> the most jobs of that key seen running at once (in the task body); "*":
#: of every key.
PEAK = "{test:keyed}:peak"
#: HASH key -> jobs of that key running now.
RUNNING = "{test:keyed}:running"
#: LIST of the JSON [key, args...] of each run, in order of its start.
RUNS = "{test:keyed}:runs"
#: HASH key -> the most jobs of other keys running when a job of that key started and
#: took the key to its limit (2): proof that other keys ran beside a key at its limit.
BESIDE = "{test:keyed}:beside"

# One round trip: count this run in, raise the key's peak if it is a new one, and when it
# takes its key to the limit, note how many jobs of other keys run beside it.
_ENTER = """
local counts = {}
for _, key in ipairs({ARGV[1], '*'}) do
  local now = redis.call('HINCRBY', KEYS[1], key, 1)
  counts[key] = now
  if now > tonumber(redis.call('HGET', KEYS[2], key) or '0') then
    redis.call('HSET', KEYS[2], key, now)
  end
end
if counts[ARGV[1]] == 2 then
  local others = counts['*'] - 2
  if others > tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0') then
    redis.call('HSET', KEYS[3], ARGV[1], others)
  end
end
"""


def tenant_of(tag: str, seconds: float = 0.0, gate: str = "") -> str:
    """The concurrency key of :func:`per_tenant`: the tag up to its first ':'."""
    return tag.split(":")[0]


def _run(key: str, tag: str, seconds: float, gate: str) -> None:
    client = get_broker().client
    client.eval(_ENTER, 3, RUNNING, PEAK, BESIDE, key)
    client.rpush(RUNS, json.dumps([key, tag]))
    try:
        if seconds:
            time.sleep(seconds)
        deadline = time.monotonic() + 120
        while gate and not client.exists(gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            time.sleep(0.02)
    finally:
        client.hincrby(RUNNING, key, -1)
        client.hincrby(RUNNING, "*", -1)


@task(concurrency_key=tenant_of, concurrency_limit=2, max_attempts=3)
def per_tenant(tag: str, seconds: float = 0.0, gate: str = "") -> None:
    """At most 2 jobs of a tenant (the tag before ':') at once."""
    _run(tenant_of(tag), tag, seconds, gate)


@task(max_attempts=3)
def digest(key: str, version: int) -> None:
    """Note a digest sent (debounced by its callers)."""
    get_broker().client.rpush(RUNS, json.dumps([key, version]))
