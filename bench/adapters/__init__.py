"""One module per library: how it enqueues, bulk-enqueues, schedules a job and starts a
worker (see ``bench.harness.ops.Adapter``).

Workers and ``python -m bench.harness`` import these modules by their short names with
this directory on PYTHONPATH, as a project's directory is on its workers' path: the task
names every library stores with a job (``rq_bench.noop``, ``delayq_benchapp.tasks.noop``)
stay what they were, and so do the bytes per job.
"""
