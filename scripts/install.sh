#!/usr/bin/env bash
# Install everything pgoverlay and its tests need on Debian 12, as root:
# Postgres server binaries, xfsprogs, and the package in a virtual environment (.venv).
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "error: run this as root (sudo $0): it installs Debian packages" >&2
    exit 3
fi

export DEBIAN_FRONTEND=noninteractive
packages=(postgresql-15 postgresql-client-15 xfsprogs util-linux uidmap kmod python3-venv git ca-certificates)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    # Debian creates and starts a default cluster when Postgres is installed; pgoverlay
    # runs its own servers, so ask for none.
    mkdir -p /etc/postgresql-common
    if [ ! -f /etc/postgresql-common/createcluster.conf ]; then
        echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
    fi
    echo "installing: ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
stamp=.venv/.installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing the pgoverlay package into .venv"
    log=$(mktemp)
    if ! { "$python" -m venv .venv &&
           .venv/bin/python -m pip install --upgrade pip &&
           .venv/bin/python -m pip install -e '.[test]'; } >"$log" 2>&1; then
        cat "$log" >&2
        echo "error: installing the package failed (output above)" >&2
        exit 1
    fi
    rm -f "$log"
    echo "$want" > "$stamp"
fi
# Put the command on PATH for the runner admin.
if [ -d /usr/local/bin ]; then
    ln -sf "$PWD/.venv/bin/pgoverlay" /usr/local/bin/pgoverlay
fi
