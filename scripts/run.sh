#!/usr/bin/env bash
# The README's two commands, with nothing needed beyond bash and Python 3.11 (no make):
#   bash scripts/run.sh demo   install everything, then render the bundled samples -> outputs/demo.mp4
#   bash scripts/run.sh test   install everything, then run the whole test suite
# (`make demo` / `make test` do the same where make is installed.) Extra arguments go to the command.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
shift || true
case "$what" in
  demo) bash scripts/install.sh && exec .venv/bin/python -m services.local "$@" ;;
  test) bash scripts/install.sh && exec .venv/bin/python -m pytest "$@" ;;
  install) exec bash scripts/install.sh ;;
  *) echo "usage: bash scripts/run.sh demo|test|install [args...]" >&2; exit 2 ;;
esac
