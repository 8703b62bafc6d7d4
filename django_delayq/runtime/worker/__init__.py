"""The worker of one process: a few parts around one ledger of held leases.

- :mod:`.runner`: :class:`~.runner.Worker`, which puts the parts together, and its stop
  sequence;
- :mod:`.ledger`: the leases the worker holds, the one state its threads share;
- :mod:`.fetcher`: claiming jobs for each lane (threads, event loop);
- :mod:`.executor`: the threads running jobs; :mod:`.async_executor`: the event loop;
  :mod:`.jobrunner`: what both are given;
- :mod:`.execution` and :mod:`.outcome`: running one job, and what happened to it;
- :mod:`.middleware`: code around each job;
- :mod:`.acks`: the acker, sending outcomes in batches;
- :mod:`.heartbeat`: lease renewal, reclaim and liveness;
- :mod:`.timelimits`: the watchdog raising and enforcing jobs' time limits;
- :mod:`.markers`: waiting on the markers of several Cluster slots;
- :mod:`.recycle`: a worker process's job and memory limits;
- :mod:`.exit_codes`: what the exit codes mean.
"""
