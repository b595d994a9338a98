"""Each job's pull-request code in a sandbox of its own (the listener's side of
``pgoverlay.action.sandbox``).

The listener runs as an unprivileged user with a subordinate uid and gid range (/etc/subuid,
/etc/subgid; `pgoverlay webhook setup` gives it one). Every command of a job (psql on a
migration file, the migrate command) starts in new user, pid, mount and IPC namespaces
(``unshare``, which asks ``newuidmap``/``newgidmap`` for the mapping): the listener is root
inside, the range is mapped above it. There, still as that inner root, it

* gives the job's scratch folder (the PR's trees) to the job's own uid, picked from the range
  per job, so no two jobs running at once share one, and none is the listener's or root;
* makes every mount read-only, mounts that folder on ``/tmp`` and fresh, empty tmpfs on
  ``/dev/shm``, ``/var/tmp`` and ``/run/lock`` (``mounts.py``): the job can write nowhere
  but in places of its own, gone with it, and sees no other job's files;
* drops to the job's uid and gid with no supplementary group (so not the service's group: the
  engine socket is out of reach), no capabilities and ``no_new_privs``, and runs the command.

The command is a child of the namespace's pid 1, a shell that stays the namespace's root: when
the command ends, or the listener kills ``unshare`` at a timeout (or dies), that shell ends and
the kernel kills every process of the namespace, detached or not. Files owned by the
job's uid cannot be removed by the listener's own uid: :meth:`JobSandbox.remove` removes the
scratch folder from inside such a namespace. The network is shared: the branch is on TCP
localhost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgoverlay.errors import CommandError, SandboxError
from pgoverlay.runner import proc
from pgoverlay.webhook import mounts

# The uid and gid namespaces: the listener is root inside, and `auto` maps the first 65536 ids
# of its /etc/subuid and /etc/subgid ranges above it (inner ids 1 to 65535).
_MAPPED = (
    "--user",
    "--map-users=auto",
    "--map-groups=auto",
    "--map-root-user",
)
_JAILED = (*_MAPPED, "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc")
FIRST_UID, LAST_UID = 1000, 65535  # job uids inside the namespace (below 1000: left unused)
# Runs as the namespace's root, with the scratch folder, the job's uid and the folder to work
# in (relative to the scratch folder) first; then runs the command as the job. The shell stays
# pid 1 and root inside (not exec'd away): a change of uid would clear the signal that kills
# it when `unshare` dies (at a timeout, or with the listener), and the job cannot signal it.
_INSIDE = """
set -eu
scratch=$1 uid=$2 dir=$3 python=$4 mounts=$5
shift 5
chown -R -h "$uid:$uid" "$scratch"
chmod 0700 "$scratch"
"$python" -I -S "$mounts" "$scratch"
cd "/tmp/$dir"
setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all \
    --bounding-set=-all --no-new-privs -- "$@"
"""
JOB_HOME = mounts.SCRATCH_AT  # the job's own scratch folder, mounted there in its namespace
_MOUNTS = Path(mounts.__file__)  # run by the namespace's root as a file: see mounts.py
SETUP_HINT = (
    "run `pgoverlay webhook setup` as root (it gives the listener's user a subordinate uid and "
    "gid range) and install the `uidmap` package (newuidmap, newgidmap)"
)


def job_uid(job_id: int) -> int:
    """The uid inside the namespace for job ``job_id``: jobs running at once (ids less than
    64,000 apart) never share one."""
    return FIRST_UID + job_id % (LAST_UID - FIRST_UID + 1)


def check() -> None:
    """Refuse to run the listener where jobs could not be sandboxed: as root, or without a
    subordinate id range and the tools that map it."""
    if os.geteuid() == 0:
        raise SandboxError(
            "the webhook listener does not run as root: run it as its own user "
            "(`pgoverlay webhook setup` makes it; the systemd unit runs as pgoverlay-webhook)"
        )
    for tool in ("unshare", "newuidmap", "newgidmap", "setpriv"):
        if shutil.which(tool, path=proc.child_env()["PATH"]) is None:
            raise SandboxError(f"{tool} is missing, and jobs cannot be sandboxed: {SETUP_HINT}")
    try:
        proc.run(["unshare", *_JAILED, "--", "true"], timeout=30)
    except CommandError as err:
        raise SandboxError(f"cannot make a sandbox for jobs ({err}): {SETUP_HINT}") from None


@dataclass(frozen=True)
class JobSandbox:
    """One job's sandbox: its scratch folder (the listener's until the first command runs, the
    job's after) and its uid inside the namespace."""

    scratch: Path
    uid: int

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        env: Mapping[str, str],
        cwd: Path,
        check: bool = True,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        inside = os.path.relpath(cwd, self.scratch)
        if inside == ".." or inside.startswith("../") or os.path.isabs(inside):
            raise SandboxError(f"{cwd} is outside the job's scratch folder {self.scratch}")
        home = {
            "HOME": JOB_HOME,
            "TMPDIR": JOB_HOME,
            "USER": "pgoverlay-job",
            "LOGNAME": "pgoverlay-job",
        }
        return proc.run(
            [
                "unshare",
                *_JAILED,
                "--",
                "/bin/sh",
                "-c",
                _INSIDE,
                "pgoverlay-job",
                self.scratch,
                str(self.uid),
                inside,
                sys.executable,
                _MOUNTS,
                *argv,
            ],
            timeout=timeout,
            env={**env, **home},
            cwd="/",
            check=check,
            input_text=input_text,
        )

    def remove(self) -> None:
        """Remove the scratch folder and everything the job left in it."""
        remove_scratch(self.scratch)


def remove_scratch(path: Path) -> None:
    """Remove a job's scratch folder, whoever of the job and the listener owns its files."""
    if not os.path.lexists(path):
        return
    proc.run(["unshare", *_MAPPED, "--", "rm", "-rf", "--one-file-system", "--", path], timeout=300)
