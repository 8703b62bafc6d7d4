"""Worker processes: found with their whole tree, and always stopped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.harness import processes

# A parent that starts a child in a session of its own, as a process pool's supervisor
# does, then waits: only a walk of the process tree finds that child.
POOL = ("import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " start_new_session=True)\n"
        "time.sleep(120)\n")


def test_proc_stat_reads_parent_group_and_cpu() -> None:
    st = processes.proc_stat(os.getpid())
    assert st is not None
    assert (st.ppid, st.group) == (os.getppid(), os.getpgid(0))
    assert st.cpu_s > 0
    assert processes.proc_stat(999_999_999) is None


def _tree_of(root: int, size: int) -> dict[int, processes.ProcStat]:
    deadline = time.monotonic() + 30
    while len(tree := processes.process_tree([root])) < size:
        assert time.monotonic() < deadline, f"the process tree never reached {size}: {tree}"
        time.sleep(0.02)
    return tree


def test_a_pool_child_in_its_own_session_is_found_and_stopped() -> None:
    proc = processes.start_process([sys.executable, "-c", POOL], "test-pool")
    # The child is in the tree from its fork, and in a session of its own only once it
    # has called setsid (before its exec): wait for that.
    deadline = time.monotonic() + 30
    while True:
        tree = _tree_of(proc.pid, 2)
        child = next(pid for pid in tree if pid != proc.pid)
        if tree[child].group != proc.pid:
            break  # not in the parent's group: found by ancestry
        assert time.monotonic() < deadline, f"the child never left its parent's group: {tree}"
        time.sleep(0.02)
    processes.stop_processes([proc], grace=0.5)
    assert proc.poll() is not None
    deadline = time.monotonic() + 10
    while _alive(child, tree[child].started):
        assert time.monotonic() < deadline, "the pool's child outlived the stop"
        time.sleep(0.02)


def _alive(pid: int, started: int) -> bool:
    """Whether that process still runs (a zombie waiting for init to reap it does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == started and fields[0] != "Z"


def test_worker_env_puts_the_adapters_and_the_checkout_first() -> None:
    env = processes.worker_env({"X": "1"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[:2] == [str(processes.ADAPTERS_DIR), str(processes.ROOT)]
    assert env["X"] == "1"
