#!/usr/bin/env bash
# Install, then run the linters and the whole test suite against real servers and mounts.
# Run as root: the tests mount filesystems and run Postgres as the postgres user.
# The tests run the installed package (scripts/install.sh: Debian's python3, outside this
# checkout), so that the unprivileged users they start can read it wherever the checkout is.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
source scripts/prefix.sh
# tests/test_comment_layout.py lays the PR comment out in Debian's headless Chromium, through
# its WebDriver, in GitHub's fonts' metric twins (Liberation Sans and Mono stand for Arial and
# GitHub's own monospace list); the branch page is tested in it too. Another machine (a
# reviewer's laptop) is a network namespace made with iproute2's `ip`; JDBC clients (DBeaver,
# DataGrip) are stood for by Debian's pgJDBC, compiled against with the JDK.
test_packages=(chromium chromium-driver fonts-liberation iproute2 default-jdk-headless libpostgresql-jdbc-java)
missing=()
for pkg in "${test_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The Docker runtime's tests: dockerd and a Postgres image built from Debian's packages. A
# dockerd started for them is stopped when they end: left running, `runtime: auto` would pick
# Docker for this machine's new branches.
trap 'scripts/dockerd.sh stop' EXIT
scripts/docker.sh 15 >/dev/null
"$venv/bin/ruff" check .
"$venv/bin/python" scripts/typecheck.py
status=0
# A second base in the session pool for the whole run: a test that relies on the pool holding
# one base fails here rather than after another test's failed clean-up.
export PGOVERLAY_TEST_DECOY_BASE="${PGOVERLAY_TEST_DECOY_BASE:-1}"
# -P: the checkout's own pgoverlay/ folder must not hide the installed package
"$venv/bin/python" -P -m pytest -q -p no:cacheprovider "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
