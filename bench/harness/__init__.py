"""The measuring harness every adapter shares, so every library is timed the same way.

- ``marks``: what the benchmark's tasks do (count a job, record lateness) and its keys;
  the Lua they call lives in ``lua/``.
- ``processes``: worker processes, started in groups of their own and always stopped.
- ``cpu``: CPU of this process, of Redis and of the workers' process trees.
- ``ops``: the workloads (enqueue, bulk, process, lateness, storage) over an ``Adapter``.

``python -m bench.harness ADAPTER OP JSON`` runs one workload with the interpreter of the
adapter's library and prints one JSON line. Imports only the standard library, redis-py
and hiredis, which both virtualenvs have.
"""
