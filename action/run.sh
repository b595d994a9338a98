#!/usr/bin/env bash
# Run the PR workflow. A branch on the Docker runtime needs no root: the daemon mounts its
# overlay. Otherwise a runner that is not root uses sudo, which must allow the pgoverlay
# command without a password and keep the environment (SETENV).
set -euo pipefail
verb=${1:-run}
if [ "$(id -u)" -eq 0 ] || [ "$("$PGOVERLAY_BIN" action privileges 2>/dev/null)" = user ]; then
    exec "$PGOVERLAY_BIN" action "$verb"
fi
exec sudo -n -E "$PGOVERLAY_BIN" action "$verb"
