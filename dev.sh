#!/usr/bin/env bash
# Create or reuse a local virtual environment with daskann installed, then run
#   bash dev.sh demo [options]   the demo on an embedded LocalCluster
#   bash dev.sh test [pytest options]   the test suite (in random order; --randomly-seed=N repeats one)
#   bash dev.sh lint   ruff check and ruff format --check
#   bash dev.sh <daskann command>   any other daskann command
set -euo pipefail
cd "$(dirname "$0")"
venv="${DASKANN_VENV:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv" 2>/dev/null; then
    # some distributions ship Python without ensurepip: fall back to virtualenv
    rm -rf "$venv"
    "$python" -m pip install --quiet --user virtualenv
    "$python" -m virtualenv --quiet "$venv"
  fi
fi
stamp="$venv/.daskann-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
  touch "$stamp"
fi

command="${1:-demo}"
[ $# -gt 0 ] && shift
case "$command" in
  test)
    set +e
    "$venv/bin/python" -m pytest "$@"
    status=$?
    if [ "$status" -eq 5 ]; then
      echo "dev.sh: pytest collected no tests" >&2
      exit 1
    fi
    exit "$status"
    ;;
  lint)
    "$venv/bin/ruff" check .
    "$venv/bin/ruff" format --check .
    ;;
  *)
    exec "$venv/bin/daskann" "$command" "$@"
    ;;
esac
