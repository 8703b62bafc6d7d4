"""django-delayq's benchmark: the library against its peers on one Redis, and the
figures of its own features (pool, time limits, defaults, replicas, shards, workflows,
outbox, lake).

A tool run from the repository root (``python -m bench.run``, ``make bench``); see
bench/README.md. Importing it imports nothing: the peers' virtualenv imports its harness.
"""
