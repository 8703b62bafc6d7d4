"""Workflows over ``depends_on``: chains and groups, and a job's parents and dependants.

- :mod:`.compose`: ``chain()`` and ``group()`` of ``task.bind(...)`` jobs;
- :mod:`.view`: a job's parents and dependants with their live status, as the admin job
  page and the API show them.

The waiting and the release are the engine's (``engine/flows.py``).
"""

from .compose import Chain, Group, GroupJobs, chain, group

__all__ = ["Chain", "Group", "GroupJobs", "chain", "group"]
