"""Exit codes of :meth:`Worker.run` and of ``manage.py runworker``: the one place
that defines them, for supervisors (the process pool, systemd, Kubernetes) to rely on.

=============  ====  ==================================================================
name           code  meaning
=============  ====  ==================================================================
EXIT_OK        0     clean stop: a stop was asked (first SIGTERM/SIGINT/SIGHUP, or
                     :meth:`Worker.request_stop`) and every running job finished, or
                     ``--burst`` ran out of due work
EXIT_FORCED    1     forced stop: a second signal, or running jobs outlived the grace
                     period and were handed back (their attempt counts)
EXIT_RESTART   75    restart me: this process can no longer run jobs reliably (a job
                     overran its hard time limit and its thread cannot be stopped, or
                     every executor thread died); it handed back what it held
=============  ====  ==================================================================

75 is ``EX_TEMPFAIL`` of ``sysexits.h``: a temporary failure, try again.
"""

EXIT_OK = 0
EXIT_FORCED = 1
EXIT_RESTART = 75
