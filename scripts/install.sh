#!/usr/bin/env bash
# Install everything pgoverlay and its tests need on Debian 12, as root: Postgres server
# binaries, xfsprogs, and the package in a virtual environment every member of the `pgoverlay`
# group can run. Safe to run again: it installs only what is missing or changed.
#
# Where: PGOVERLAY_PREFIX (default /usr/local/lib/pgoverlay), world-readable, holds
#   src/   a copy of this checkout, the one the package is built from;
#   venv/  the environment, with the package installed from src/ (not editable).
# The runner's user, the webhook listener and the systemd units run that environment, and the
# tests' unprivileged children do too: none of them reads this checkout, which may be a clone
# under /root (0700). The checkout's .venv is a link to the environment; a changed tree is
# copied and installed again (seconds: dependencies are reinstalled only when pyproject.toml,
# the extras or the interpreter change). The link on PATH goes into PGOVERLAY_BINDIR (default
# /usr/local/bin).
#
# The interpreter: PYTHON, else Debian's /usr/bin/python3 (3.11 or newer), never the first
# python3 on root's PATH, which may be a pyenv or asdf build under /root that no one else can
# run. Before building, and again after, it is run as an unprivileged member of the group.
# PGOVERLAY_EXTRAS (default "test") names the package's extras to install; "" for a runner
# that will not run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD

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

source scripts/prefix.sh
bindir=${PGOVERLAY_BINDIR:-/usr/local/bin}
extras=${PGOVERLAY_EXTRAS-test}
group=${PGOVERLAY_SERVICE_GROUP:-pgoverlay}
python=${PYTHON:-/usr/bin/python3}
umask 022  # what is installed is readable by everyone, whatever root's own umask is

# Runs a command as a member of the group who is nobody else (`nobody`, with the group when it
# exists yet: `pool init` makes it), from /, with a minimal environment. Through a shell: setpriv
# itself still holds root's capabilities when it starts the command, so the command's own path
# would be looked up as root.
as_member() {
    local groups=--clear-groups gid
    if gid=$(getent group "$group" | cut -d: -f3) && [ -n "$gid" ]; then
        groups=--groups=$gid
    fi
    (cd / && env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOME=/nonexistent \
        setpriv --reuid=nobody --regid=nogroup "$groups" -- /bin/sh -c 'exec "$@"' sh "$@")
}

if ! command -v "$python" >/dev/null; then
    echo "error: there is no $python: install Debian's Python (apt-get install python3" \
         "python3-venv), or set PYTHON to a Python 3.11 or newer that every member of the $group" \
         "group can run" >&2
    exit 3
fi
if ! version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3]); sys.exit(sys.version_info < (3, 11))' 2>&1); then
    echo "error: pgoverlay needs Python 3.11 or newer; $python is ${version:-not runnable}:" \
         "install one every member of the $group group can run (Debian 12: apt-get install python3" \
         "python3-venv; elsewhere your distribution's python3.11 or newer, e.g. /usr/bin/python3.11)" \
         "and run again with PYTHON set to it" >&2
    exit 3
fi
if ! seen=$(as_member "$python" -c 'import venv' 2>&1); then
    echo "error: $python (Python $version) cannot be run by the members of the $group group" \
         "(as nobody: ${seen##*$'\n'}): the runner's user, the webhook listener and the systemd" \
         "units could not run pgoverlay. Use an interpreter outside private folders such as" \
         "/root: Debian's /usr/bin/python3 (apt-get install python3 python3-venv), or set PYTHON" >&2
    exit 3
fi

# The checkout as it is now: copied aside, then compared with what was installed last.
mkdir -p "$prefix"
chmod 0755 "$prefix"
exec 9>"$prefix/.install.lock"
flock -w 600 9 || { echo "error: another scripts/install.sh holds $prefix/.install.lock" >&2; exit 1; }
fresh=$(mktemp -d "$prefix/.src-XXXXXX")
trap 'rm -rf "$fresh"' EXIT
tar -C "$checkout" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude=.pytest_cache --exclude=.mypy_cache --exclude=.ruff_cache \
    -cf - . | tar -C "$fresh" -xf -
chmod -R u+rwX,go+rX,go-w "$fresh"
tree=$(cd "$fresh" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64)
deps=$( { cat "$fresh/pyproject.toml"; echo "extras=$extras"; realpath "$python"; echo "$version"; } |
        sha256sum | cut -c1-64)
stamp=$prefix/.installed
had_deps= had_tree=
if [ -f "$stamp" ]; then
    read -r had_deps had_tree < "$stamp" || true
fi

if [ "$had_deps" != "$deps" ] || [ "$had_tree" != "$tree" ] || [ ! -x "$venv/bin/pgoverlay" ]; then
    rm -f "$stamp"
    rm -rf "$prefix/src"
    mv "$fresh" "$prefix/src"
    chmod 0755 "$prefix/src"
    log=$(mktemp)
    spec=$prefix/src${extras:+[$extras]}
    if [ "$had_deps" != "$deps" ] || [ ! -x "$venv/bin/python" ]; then
        echo "installing the pgoverlay package and its dependencies into $venv (Python $version)"
        rm -rf "$venv"
        steps() {
            "$python" -m venv "$venv" &&
            "$venv/bin/python" -m pip install --upgrade pip 'setuptools>=77' &&
            "$venv/bin/python" -m pip install --no-build-isolation "$spec"
        }
    else
        echo "installing the changed pgoverlay package into $venv"
        steps() {
            "$venv/bin/python" -m pip install --no-deps --no-build-isolation --force-reinstall "$prefix/src"
        }
    fi
    if ! steps >"$log" 2>&1; then
        cat "$log" >&2
        echo "error: installing the package failed (output above)" >&2
        exit 1
    fi
    rm -rf "$log" "$prefix/src/build" "$prefix"/src/*.egg-info
    # What a runner's user, the listener and the units do: run the command, as a group member.
    if ! seen=$(as_member "$venv/bin/pgoverlay" --version 2>&1); then
        echo "error: $venv/bin/pgoverlay does not run for the members of the $group group" \
             "(as nobody: ${seen##*$'\n'}): run \`$venv/bin/pgoverlay doctor\` as root to see" \
             "which file or folder they cannot read" >&2
        exit 1
    fi
    echo "$deps $tree" > "$stamp"
fi

# The command on PATH, for the runner admin and the systemd units; .venv for this checkout's
# scripts (test.sh, the benchmarks). A .venv that is a folder of its own is left alone.
if [ -d "$bindir" ]; then
    ln -sfn "$venv/bin/pgoverlay" "$bindir/pgoverlay"
fi
if [ -L .venv ] || [ ! -e .venv ] || [ -f .venv/.installed ]; then
    # .venv/.installed: the folder an earlier install.sh made inside the checkout
    [ -L .venv ] || rm -rf .venv
    ln -sfn "$venv" .venv
else
    echo "note: .venv is an environment of its own, left as it is; $venv holds the installed one"
fi
