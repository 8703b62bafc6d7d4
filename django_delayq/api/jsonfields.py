"""A job's arguments as the API accepts them: JSON in a JSON body, and JSON text in a form.

The browsable API draws a POST form and sends it form-encoded. DRF's list and dict fields
cannot be drawn in a form ("not supported in HTML input"), so the arguments are JSON
fields drawn as text areas: in a form, the text of a field is parsed as JSON (a clear
400 when it is not JSON, or not a list / an object); in a JSON body, the value is taken
as it is and must already be a list / an object (a string is not parsed again).
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.utils import html


def _no_constant(name: str) -> NoReturn:
    """JSON has no NaN or Infinity: a form's text is refused as the JSON parser refuses
    a body holding them."""
    raise ValueError(f"{name} is not JSON")


class _JSONValueField(serializers.JSONField):
    """A JSON value of one Python type, drawn as a text area holding JSON."""

    kind: type[Any] = object
    default_error_messages = {
        "not_json": "Not valid JSON ({error}); write for example {example}.",
        "wrong_type": "Expected {kind} but got type \"{got}\".",
    }
    example = ""
    kind_name = ""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("style", {"base_template": "textarea.html", "rows": 3})
        super().__init__(**kwargs)

    def get_value(self, dictionary: Any) -> Any:
        """A blank text area in a form counts as not given (the field's default)."""
        if html.is_html_input(dictionary) and not str(dictionary.get(self.field_name, "")).strip():
            return empty
        return super().get_value(dictionary)

    def to_internal_value(self, data: Any) -> Any:
        try:
            if getattr(data, "is_json_string", False):  # the text of a form's field
                data = json.loads(data, parse_constant=_no_constant)
            value = super().to_internal_value(data)  # its json.dumps check recurses too
        except ValueError as exc:
            self.fail("not_json", error=exc, example=self.example)
        except RecursionError:  # the parser recurses per level: the client's error
            self.fail("not_json", error="nested too deeply", example=self.example)
        if not isinstance(value, self.kind):
            self.fail("wrong_type", kind=self.kind_name, got=type(value).__name__)
        return value


@extend_schema_field({"type": "array", "items": {}})
class JSONListField(_JSONValueField):
    """Positional arguments: a JSON array."""

    kind = list
    kind_name = "a list of items"
    example = '["one", 2]'


@extend_schema_field({"type": "object", "additionalProperties": {}})
class JSONObjectField(_JSONValueField):
    """Keyword arguments: a JSON object."""

    kind = dict
    kind_name = "a dictionary of items"
    example = '{"name": "value"}'
