"""Optional helpers for projects that use django-delayq (the pytest plugin)."""
