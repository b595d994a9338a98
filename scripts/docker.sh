#!/usr/bin/env bash
# Make Docker usable for the Docker runtime's tests, as root: install Debian's docker.io, start
# dockerd if none answers (scripts/dockerd.sh), and build a local Postgres image from Debian
# packages (no registry is needed). The image is built once; a second run reuses it.
#
#   scripts/docker.sh [MAJOR]     # prints the image name on its last line
set -euo pipefail
cd "$(dirname "$0")/.."

major=${1:-15}
image="pgoverlay-local/postgres:${major}"
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ "$(id -u)" -ne 0 ]; then
    echo "error: run this as root (sudo $0): it installs packages and starts dockerd" >&2
    exit 3
fi

export DEBIAN_FRONTEND=noninteractive
missing=()
for pkg in docker.io debootstrap; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

docker=/usr/bin/docker
scripts/dockerd.sh start   # scripts/test.sh stops at its end a daemon started here

if ! "$docker" image inspect "$image" >/dev/null 2>&1; then
    echo "building $image from Debian's postgresql-${major} (a few minutes, once)" >&2
    root=$(mktemp -d /var/tmp/pgoverlay-image.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include="postgresql-${major}" "$suite" "$root" "$mirror" \
        >"$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
    rm -f "$root.log"
    # Debian's package made a cluster and left apt's downloads; the image needs neither.
    rm -rf "$root"/var/lib/postgresql/"${major}" "$root"/etc/postgresql/"${major}" \
        "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | "$docker" import \
        --change "ENV PATH=/usr/lib/postgresql/${major}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV LANG=C.UTF-8" \
        --change "ENV PG_MAJOR=${major}" \
        --change 'CMD ["postgres"]' \
        - "$image" >/dev/null
fi
echo "$image"
