"""The views of the django-tasks backport's tests (``tests/views.py``): enqueue a task
in one request, read its result in another."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from . import port_tasks

try:
    from django.tasks import TaskResult, TaskResultStatus, default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # the django-tasks backport on Django 5.2
    from django_tasks import TaskResult, TaskResultStatus, default_task_backend
    from django_tasks.exceptions import TaskResultDoesNotExist


def get_result_value(result: TaskResult) -> Any:
    if result.status == TaskResultStatus.SUCCESSFUL:
        return result.return_value
    if result.status == TaskResultStatus.FAILED:
        return result.errors[0].traceback
    return None


def as_json(result: TaskResult) -> HttpResponse:
    return JsonResponse({"result_id": result.id, "result": get_result_value(result),
                         "status": result.status})


def calculate_meaning_of_life(request: HttpRequest) -> HttpResponse:
    return as_json(port_tasks.calculate_meaning_of_life.enqueue())


async def calculate_meaning_of_life_async(request: HttpRequest) -> HttpResponse:
    return as_json(await port_tasks.calculate_meaning_of_life.aenqueue())


async def get_task_result(request: HttpRequest, result_id: str) -> HttpResponse:
    try:
        result = await default_task_backend.aget_result(result_id)
    except TaskResultDoesNotExist:
        raise Http404 from None
    return as_json(result)
