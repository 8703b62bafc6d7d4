"""System checks for ``settings.DELAYQ``: each problem has a stable id.

Each setting's check and id are in the settings table (:mod:`django_delayq.conf`); this
module runs them on the settings the user gave (every default passes its own check), and
names each replaced setting with what to write instead.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register

from .conf import SETTINGS, replaced


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate every key of ``settings.DELAYQ``."""
    user = getattr(settings, "DELAYQ", None)
    if user is None:
        return []
    if not isinstance(user, dict):
        return [Error(f"settings.DELAYQ must be a dict, not {type(user).__name__}.",
                      id="django_delayq.E001")]
    moved = replaced(user)
    errors: list[CheckMessage] = [Error(problem, id=check_id) for _, check_id, problem in moved]
    unknown = sorted(set(user) - set(SETTINGS) - {name for name, _, _ in moved})
    if unknown:
        errors.append(Error(f"Unknown DELAYQ settings: {', '.join(unknown)}.",
                            hint=f"Known settings: {', '.join(sorted(SETTINGS))}.",
                            id="django_delayq.E022"))
    for name, row in SETTINGS.items():
        if name not in user:
            continue
        for problem in row.check(user[name]):
            space = "" if problem.startswith("[") else " "
            errors.append(Error(f"DELAYQ[{name!r}]{space}{problem}", hint=row.hint,
                                id=row.check_id))
    return errors
