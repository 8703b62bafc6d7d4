"""What every API view shares: permissions from settings, and engine errors as HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound, ParseError
from rest_framework.response import Response
from rest_framework.views import APIView

from ..engine import DelayQConnectionError, InvalidJobState, JobNotFound
from ..engine.errors import CommandRefused
from ..engine.logfields import log
from .permissions import DelayQPermissionsMixin


class ServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The job queue's Redis is unreachable; try again later."
    default_code = "redis_unavailable"


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The job's state does not allow this."
    default_code = "invalid_state"


def to_api_exception(exc: Exception) -> Exception:
    """The HTTP error for an engine error (503, 404, 409) or a body nested too deeply
    (400); other errors unchanged."""
    if isinstance(exc, DelayQConnectionError):
        # Where Redis is (its address) is for the log, not for every API caller.
        log(logging.getLogger("django_delayq.api"), logging.WARNING, "API: Redis unreachable",
            error=exc)
        return ServiceUnavailable("The job queue's Redis is unreachable; try again shortly.")
    if isinstance(exc, CommandRefused):
        # Redis's words name keys and commands: for the log, not for every caller.
        log(logging.getLogger("django_delayq.api"), logging.WARNING, "API: Redis refused a "
            "command", error=exc)
        return ServiceUnavailable("The job queue's Redis refused the command (a damaged key, "
                                  "an ACL); the server's log says which.")
    if isinstance(exc, JobNotFound):
        return NotFound(str(exc))
    if isinstance(exc, InvalidJobState):
        return Conflict(str(exc))
    if isinstance(exc, RecursionError):
        # The JSON parser recurses per nesting level: a deep body is the client's error.
        return ParseError("The JSON body is nested too deeply.")
    return exc


F = TypeVar("F", bound=Callable[..., Any])


def document(**kwargs: Any) -> Callable[[F], F]:
    """``extend_schema`` on drf-spectacular's AutoSchema, whatever the project's
    ``DEFAULT_SCHEMA_CLASS`` (so the schema works without REST_FRAMEWORK settings)."""

    def decorator(method: F) -> F:
        method.schema = AutoSchema  # type: ignore[attr-defined]
        decorated: F = extend_schema(**kwargs)(method)
        del decorated.schema  # type: ignore[attr-defined]
        return decorated

    return decorator


class NoInput(serializers.Serializer):
    """The body of an action that takes none (the browsable API's form is empty)."""


class DelayQAPIView(DelayQPermissionsMixin, APIView):
    """Base of the API views: configured permissions, OpenAPI through drf-spectacular.

    The views hold no queryset: what they show is read live from Redis. The browsable
    API asks a view for a serializer to draw the form of a POST: ``form_serializer``,
    the serializer of the request body (``NoInput`` for an action without one).
    """

    schema = AutoSchema()
    form_serializer: type[serializers.Serializer] = NoInput

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return self.form_serializer

    def get_serializer(self, *args: Any, **kwargs: Any) -> serializers.BaseSerializer:
        """A serializer for the browsable API's forms (and for subclasses' answers)."""
        kwargs.setdefault("context", {"request": self.request, "view": self})
        return self.get_serializer_class()(*args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response:
        return super().handle_exception(to_api_exception(exc))

    def parsed(self, serializer_class: type[Any], data: Any) -> dict[str, Any]:
        """``data`` validated by ``serializer_class`` (a 400 answer when it is not valid)."""
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)
