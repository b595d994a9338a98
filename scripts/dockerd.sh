#!/usr/bin/env bash
# The Docker daemon for the Docker runtime's tests, as root, on a machine without systemd:
#
#   scripts/dockerd.sh start    # start dockerd if none answers; remember that this one did
#   scripts/dockerd.sh stop     # stop the dockerd `start` started, if it did; else nothing
#
# scripts/test.sh stops at its end the daemon it started: left running, `PGOVERLAY_RUNTIME=auto`
# (the default) would pick Docker for the machine's new branches, so running the tests would
# change how pgoverlay behaves there. A daemon that answered already (systemd's, the admin's) is
# never stopped. Under systemd, `start` asks systemd, and `stop` leaves the unit to the admin.
set -euo pipefail

docker=/usr/bin/docker
state=/run/pgoverlay-test-dockerd.pid   # the pid of the daemon `start` started
log=/var/log/pgoverlay-dockerd.log

answers() { "$docker" info >/dev/null 2>&1; }

start() {
    answers && return 0
    if [ -d /run/systemd/system ]; then
        systemctl start docker
    else
        # No init system to ask (a container or a bare CI machine): run the daemon ourselves.
        setsid /usr/sbin/dockerd >"$log" 2>&1 </dev/null &
        echo "$!" >"$state"
    fi
    for _ in $(seq 1 120); do
        answers && return 0
        sleep 0.5
    done
    tail -n 30 "$log" >&2 || true
    echo "error: dockerd did not start within 60 s (its log is above)" >&2
    exit 1
}

stop() {
    [ -f "$state" ] || return 0
    pid=$(cat "$state")
    # Only that daemon: a pid reused by another program is left alone.
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
        kill -TERM "$pid"
        for _ in $(seq 1 120); do
            [ -e "/proc/$pid" ] || break
            sleep 0.5
        done
        if [ -e "/proc/$pid" ]; then
            echo "error: the dockerd the tests started (pid $pid) did not stop within 60 s" >&2
            exit 1
        fi
        echo "stopped the dockerd the tests started (pid $pid)" >&2
    fi
    rm -f "$state"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
