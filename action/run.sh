#!/usr/bin/env bash
# Run the PR workflow. The engine mounts branches and keeps the pool's registry root-only, so a
# runner that is not root uses sudo, which must allow the pgoverlay command without a password
# and keep the environment (SETENV).
set -euo pipefail
verb=${1:-run}
if [ "$(id -u)" -eq 0 ]; then
    exec "$PGOVERLAY_BIN" action "$verb"
fi
exec sudo -n -E "$PGOVERLAY_BIN" action "$verb"
