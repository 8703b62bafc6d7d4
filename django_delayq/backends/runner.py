"""The function a delayq worker runs for a task of Django's Tasks framework: the task's
own, with its context and the framework's signals."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ..runtime.current import RunningJob, current_job
from .framework import Task, TaskContext, TaskResult, normalize_json, task_finished, task_started
from .results import fail, finish, running_result, send_finished


def _invoke(task: Task, result: TaskResult, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
    """Call ``task``'s function, with its context when it takes one (for an ``async def``
    function, its coroutine)."""
    if task.takes_context:
        return task.func(TaskContext(task_result=result), *args, **kwargs)
    return task.func(*args, **kwargs)


def returned(value: Any) -> Any:
    """``value`` through ``normalize_json``; a value JSON has no type for raises Django's
    ``TypeError`` (``Unsupported type``) saying, as Django's backends do, that the return
    value "is not JSON serializable"."""
    try:
        return normalize_json(value)
    except TypeError as exc:
        raise TypeError(f"{exc}: the return value ({type(value).__name__}) is not JSON "
                        "serializable") from None


def make_runner(task: Task) -> Callable[..., Any]:
    """The function a delayq worker calls for ``task``: the task's own, with its context
    (``takes_context``) and the Tasks signals ``task_started``/``task_finished``. Its
    value is returned as Django's backends keep it, through ``normalize_json``: a value
    that JSON has no type for (a datetime, a function) fails the task, as it does there.
    """
    func = task.func

    def run(*args: Any, **kwargs: Any) -> Any:
        running, result, sender = _started(task, args, kwargs)
        task_started.send(sender, task_result=result)
        if running is not None:
            # On a worker, task_finished waits for the job's final outcome: after the
            # return value is encoded, and for whatever the task raises.
            raised: list[BaseException] = []
            running.on_finished.append(
                functools.partial(send_finished, sender, result, raised=raised))
            try:
                return returned(_invoke(task, result, args, kwargs))
            except BaseException as exc:
                raised.append(exc)
                raise
        try:
            value = returned(_invoke(task, result, args, kwargs))
        except Exception as exc:
            fail(result, exc)
            task_finished.send(sender, task_result=result)
            raise
        finish(result, value)
        task_finished.send(sender, task_result=result)
        return value

    async def arun(*args: Any, **kwargs: Any) -> Any:
        # As run, its signals sent with asend (sync receivers run through sync_to_async);
        # on a worker, the hook is called off the event loop, as asend runs sync receivers.
        running, result, sender = _started(task, args, kwargs)
        await task_started.asend(sender, task_result=result)
        if running is not None:
            raised: list[BaseException] = []
            running.on_finished.append(
                functools.partial(send_finished, sender, result, raised=raised))
            try:
                return returned(await _invoke(task, result, args, kwargs))
            except BaseException as exc:
                raised.append(exc)
                raise
        try:
            value = returned(await _invoke(task, result, args, kwargs))
        except Exception as exc:
            fail(result, exc)
            await task_finished.asend(sender, task_result=result)
            raise
        finish(result, value)
        await task_finished.asend(sender, task_result=result)
        return value

    runner = arun if inspect.iscoroutinefunction(func) else run
    functools.update_wrapper(runner, func)
    if task.takes_context:  # the caller's arguments exclude the leading ``context``
        sig = inspect.signature(func)
        runner.__signature__ = sig.replace(  # type: ignore[union-attr]
            parameters=list(sig.parameters.values())[1:])
    return runner


def _started(task: Task, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> tuple[RunningJob | None, TaskResult, type]:
    """The job this thread runs (None outside a worker), its RUNNING result, and the
    sender of the Tasks signals."""
    running = current_job()
    return running, running_result(task, running, args, kwargs), type(task.get_backend())
