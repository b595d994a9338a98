#!/usr/bin/env bash
# Run the PR workflow as the runner's own user. Branches come from the engine service, whose
# socket the `pgoverlay` group may use; nothing here needs or asks for more privileges.
set -euo pipefail
verb=${1:-run}
# the step's start, so the log can say how long the interpreter and its imports took
export PGOVERLAY_STEP_STARTED=$EPOCHREALTIME
# pgoverlay-action is `pgoverlay action` without the command line's other commands: installed
# next to pgoverlay by setup.sh, it starts faster.
exec "${PGOVERLAY_BIN%/*}/pgoverlay-action" "$verb"
