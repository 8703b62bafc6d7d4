#!/usr/bin/env bash
# The peers' table (`make bench` runs it first): set up both virtualenvs, then run the
# orchestrator (arguments pass through, e.g. bench/run.sh --scale 0.1 --runs 1
# --libraries django_delayq,rq).
#   .venv              the project's (made by the Makefile; made here if missing)
#   bench/.venv-peers  the peer libraries, pinned in bench/requirements-peers.txt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e .
fi

PEERS=bench/.venv-peers
STAMP="$PEERS/.installed-$(cksum < bench/requirements-peers.txt | cut -d' ' -f1)"
if [ ! -f "$STAMP" ]; then
    test -x "$PEERS/bin/python" || "$PY" -m venv "$PEERS"
    "$PEERS/bin/python" -m pip install -q --upgrade pip
    "$PEERS/bin/python" -m pip install -q -r bench/requirements-peers.txt
    rm -f "$PEERS"/.installed-*
    touch "$STAMP"
fi

exec .venv/bin/python -m bench.run "$@"
