"""The benchmark jobs, as every other library runs them (see ``bench.harness.marks``), and
the no-op job as a coroutine (django-delayq's async row)."""

from __future__ import annotations

from bench.harness import marks
from django_delayq import task


@task(queue="bench", max_attempts=1)
def noop() -> None:
    marks.mark_done()


@task(queue="bench_async", max_attempts=1)
async def anoop() -> None:
    """The no-op job as a coroutine, run on the worker's event loop (its own queue: the
    loop's lane of the worker claims it)."""
    marks.mark_done()


@task(queue="bench", max_attempts=1)
def late(due_us: int) -> None:
    marks.mark_late(due_us)


#: Keys of the workflow benchmark (bench/workflows.py): the Redis time (µs) of the last
#: member's finish, and of the callback's start.
LAST_MEMBER_KEY = "bench:flow:last_member_us"
CALLBACK_KEY = "bench:flow:callback_us"


@task(queue="bench", max_attempts=1)
def member(i: int) -> int:
    """A group member: note the Redis time it finished (the latest one wins)."""
    marks.note_time(marks.client(), LAST_MEMBER_KEY)
    return i


@task(queue="bench", max_attempts=1)
def callback(results: list[int]) -> int:
    """The group's callback: note the Redis time it started."""
    marks.note_time(marks.client(), CALLBACK_KEY)
    return len(results)
