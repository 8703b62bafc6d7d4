"""The runtime: what runs jobs and background loops, with no Django in it.

- :mod:`.worker`: the worker of one process (claims, runs, acks, heartbeat, time limits);
- :mod:`.registry`: the tasks a worker may run, by name;
- :mod:`.current`: the job the current thread runs (``current_job()``);
- :mod:`.schedule` and :mod:`.periodic`: periodic tasks' occurrences;
- :mod:`.backoff`: how a loop waits while Redis fails;
- :mod:`.health`: whether a worker is healthy (``delayq_health``).

It reads no settings and imports no framework: the Django layer above it gives it
options, brokers, the task registry and the middleware around jobs.
"""
