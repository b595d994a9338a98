#!/usr/bin/env bash
# Install, prepare the pool, and run the demo: seed a sample base, branch it, apply the example
# migrations, print how to connect. Run as root on the runner.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
source scripts/prefix.sh
"$venv/bin/pgoverlay" pool init
"$venv/bin/pgoverlay" demo "$@"
