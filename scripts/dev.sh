#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/dev.sh serve [attnscope serve options]   set up .venv/ and start the app
#   bash scripts/dev.sh test  [pytest options]            set up .venv/, then ruff, mypy and pytest
#   bash scripts/dev.sh check                             set up .venv/, then ruff and mypy only
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-serve}; shift || true

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.attnscope-installed
want=$(cat pyproject.toml scripts/dev.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VPY" -m pip install -q --upgrade pip
  # the CPU build of torch first: a bare "torch" could pull a multi-GB CUDA build
  "$VPY" -m pip install -q "torch==2.13.0"
  "$VPY" -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi

gates() {
  # lint and strict types first: a finding fails the run before the tests start
  "$VPY" -m ruff check .
  "$VPY" -m mypy
}

case "$cmd" in
  serve)
    exec .venv/bin/attnscope serve "$@"
    ;;
  test)
    # Debian's Chromium drives the browser tests (never a downloaded browser build), with a
    # CJK font so that Chinese text renders as characters, not boxes, in the screenshots
    if [ ! -x /usr/bin/chromium ] || ! fc-list :lang=zh 2>/dev/null | grep -q .; then
      sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
      $sudo apt-get update -qq
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-zenhei fontconfig >/dev/null
    fi
    gates
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ATTNSCOPE_REQUIRE_BROWSER=1
    exec "$VPY" -m pytest "$@"
    ;;
  check)
    gates
    ;;
  *)
    echo "usage: bash scripts/dev.sh serve|test|check [args]" >&2
    exit 2
    ;;
esac
