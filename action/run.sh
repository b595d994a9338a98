#!/usr/bin/env bash
# Run the PR workflow as the runner's own user. Branches come from the engine service, whose
# socket the `pgoverlay` group may use; nothing here needs or asks for more privileges.
set -euo pipefail
verb=${1:-run}
# the step's start, so the log can say how long the interpreter and its imports took
export PGOVERLAY_STEP_STARTED=$EPOCHREALTIME
# pgoverlay-action is `pgoverlay action` without the command line's other commands: installed
# next to pgoverlay by setup.sh, it starts faster. It sets the `status` output itself, also
# when it fails; if it failed before it could (it did not start, or crashed on start-up),
# `status=failed` is written here. GITHUB_OUTPUT is this step's own file: a regular file
# without `status` means nothing set it.
code=0
"${PGOVERLAY_BIN%/*}/pgoverlay-action" "$verb" || code=$?
output=${GITHUB_OUTPUT:-}
if [ "$code" != 0 ] && [ -n "$output" ] && [ -f "$output" ] && [ ! -L "$output" ] &&
   ! grep -q '^status' "$output"; then
    echo "status=failed" >> "$output"
fi
exit "$code"
