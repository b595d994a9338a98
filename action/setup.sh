#!/usr/bin/env bash
# Install pgoverlay from the action's own checkout into a cached virtual environment, once per
# version of the action; later runs reuse it. Prints `bin=<path to pgoverlay>` to GITHUB_OUTPUT.
#
# Before that build (tens of seconds on a first run): can this user reach the engine service?
# A runner's user outside the service's group, or a host with no service, fails here at once.
# Whatever fails, `status=failed` is written, so a later step can tell.
set -euo pipefail

source_dir=${ACTION_PATH:?ACTION_PATH is not set}
trap 'code=$?; if [ "$code" != 0 ] && [ -n "${GITHUB_OUTPUT:-}" ]; then
          echo "status=failed" >> "$GITHUB_OUTPUT" || true
      fi' EXIT

if [ -z "${INPUT_SERVER:-}" ]; then
    # The host's python3, isolated; this file uses nothing but its standard library.
    python3 -I "$source_dir/runner/service/access.py"
else
    # The pool is reached over the network (the `server` input): no service, group or root
    # here. The migrations still run with psql, as a client: a runner without one (a
    # GitHub-hosted image has it) gets Debian's or Ubuntu's, when it may install packages.
    if ! compgen -G '/usr/lib/postgresql/*/bin/psql' >/dev/null; then
        if [ "$(id -u)" = 0 ]; then
            apt-get update -q >/dev/null && apt-get install -y -q postgresql-client >/dev/null
        elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            sudo -n apt-get update -q >/dev/null && sudo -n apt-get install -y -q postgresql-client >/dev/null
        else
            echo "::error::this runner has no psql (the migrations run with it) and may not install one: install postgresql-client on the runner"
            exit 1
        fi
    fi
fi

cache_root=${RUNNER_TOOL_CACHE:-${HOME:-/tmp}/.cache}/pgoverlay
# The interpreter: the host's own /usr/bin/python3 (Debian 12: 3.11.2), as scripts/install.sh
# uses, not whichever python3 an earlier step (setup-python) put first on PATH; that one only
# when the host's is missing or older than 3.11.
newer='import sys; sys.exit(sys.version_info < (3, 11))'
python=
for candidate in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [ -n "$candidate" ] && "$candidate" -c "$newer" 2>/dev/null; then
        python=$candidate
        break
    fi
done
if [ -z "$python" ]; then
    echo "::error::pgoverlay needs Python 3.11 or newer on the runner host: install it (Debian 12: apt-get install python3 python3-venv)"
    exit 1
fi
version=$(cd "$source_dir" && { find pyproject.toml pgoverlay/ runner/ action/ webhook/ examples/ \
            -type f \( -name '*.py' -o -name '*.toml' -o -name '*.sql' \) -print0 2>/dev/null |
          sort -z | xargs -0 sha256sum; realpath "$python"; } | sha256sum | cut -c1-16)
venv=$cache_root/$version
mkdir -p "$cache_root"

(
    flock -w 600 9 || { echo "::error::timed out waiting for another job installing pgoverlay"; exit 1; }
    if [ ! -f "$venv/.complete" ]; then
        echo "installing pgoverlay $version into $venv"
        rm -rf "$venv"
        "$python" -m venv "$venv"
        log=$(mktemp)
        # Build from a clean copy: a stale build/ directory in the checkout would be reused.
        src=$(mktemp -d)
        trap 'rm -rf "$src"' EXIT
        tar -C "$source_dir" --exclude=./build --exclude=./.venv --exclude=./.git -cf - . | tar -C "$src" -xf -
        if ! "$venv/bin/python" -m pip install --disable-pip-version-check "$src" >"$log" 2>&1; then
            cat "$log"
            echo "::error::installing pgoverlay from $source_dir failed (output above)"
            exit 1
        fi
        rm -f "$log"
        touch "$venv/.complete"
    else
        echo "reusing pgoverlay $version from $venv"
    fi
) 9>"$cache_root/.install.lock"

echo "bin=$venv/bin/pgoverlay" >> "${GITHUB_OUTPUT:?GITHUB_OUTPUT is not set}"
