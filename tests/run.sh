#!/usr/bin/env bash
# The whole test suite, as CI runs it (after `bash install.sh`):
#   1. Debian's chromium for the web page's browser test, where it is missing and apt-get can
#      install it (as root); elsewhere that test is skipped and says why;
#   2. the main suite (pytest exits 5 when it collected nothing: a failure here);
#   3. the verl plug-in's tests, in a virtual environment of their own (verl pins an older
#      transformers than the rest of the stack).
#   bash tests/run.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; } \
    || echo "chromium could not be installed: the browser test will be skipped" >&2
fi
python3 -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: that is a failure for this project" >&2; exit 1; fi
[ "$rc" -eq 0 ] || exit "$rc"
bash tests/integrations/verl_env.sh
