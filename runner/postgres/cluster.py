"""A Postgres server on a private socket, for the engine's own use: preparing a base,
restoring a dump into a fresh cluster, or the demo's throwaway source."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgoverlay.runner import safefs
from pgoverlay.runner.postgres.tools import Tools
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.settings import SUPERUSER_RESERVED

PRIVATE_PORT = 5432

# What keeps a server started on a copy of production from reaching back into it, or waiting
# on it, whatever the copy's own files say: every branch and the engine's own start of a base
# run with these on the command line (see branch.conf.server_options).
CUT_OFF = {
    "external_pid_file": "",
    "recovery_init_sync_method": "syncfs",
    "archive_mode": "off",
    "archive_command": "",
    "restore_command": "",
    "primary_conninfo": "",
    "primary_slot_name": "",
    "synchronous_standby_names": "",
    # No subscription's apply worker starts, whatever the catalogs say (lockdown also
    # disables every subscription in the base).
    "max_logical_replication_workers": "0",
    "huge_pages": "try",
    "unix_socket_group": "",
    "superuser_reserved_connections": str(SUPERUSER_RESERVED),
}


@dataclass(frozen=True)
class Running:
    socket_dir: Path
    port: int
    datadir: Path

    def conninfo(self, *, user: str, dbname: str = "postgres") -> dict[str, Any]:
        return {
            "host": os.fspath(self.socket_dir),
            "port": self.port,
            "user": user,
            "dbname": dbname,
        }


def initdb(
    install: Tools,
    datadir: Path,
    *,
    owner: OsUser,
    superuser: str = "postgres",
    timeout: float = 300,
) -> None:
    install.run(
        "initdb",
        [
            "-D",
            datadir,
            "-U",
            superuser,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
            "--no-instructions",
        ],
        timeout=timeout,
        user=owner,
    )


@contextmanager
def running(
    install: Tools,
    datadir: Path,
    *,
    owner: OsUser,
    scratch: Path,
    options: Mapping[str, str] | None = None,
    timeout: float = 600,
    stop_timeout: float = 120,
) -> Iterator[Running]:
    """Run Postgres on ``datadir`` reachable only through a private socket; stop it on exit.

    ``scratch`` holds the socket, the configuration and the log (short path: sockets are
    limited to 107 bytes).
    """
    work = Path(tempfile.mkdtemp(prefix=f"pgo-{os.getpid()}-", dir=scratch))
    try:
        # Root writes the files while the directory is still its own, then hands it over.
        hba = work / "pg_hba.conf"
        safefs.write_new(
            hba,
            "local all all trust\nlocal replication all trust\n",
            uid=owner.uid,
            gid=owner.gid,
            mode=0o600,
        )
        conf = work / "postgresql.conf"
        safefs.write_new(
            conf,
            f"include_if_exists '{datadir / 'postgresql.conf'}'\n",
            uid=owner.uid,
            gid=owner.gid,
            mode=0o600,
        )
        os.chown(work, owner.uid, owner.gid)
        os.chmod(work, 0o700)
        settings = {
            "data_directory": os.fspath(datadir),
            "config_file": os.fspath(conf),
            "hba_file": os.fspath(hba),
            "listen_addresses": "",
            "port": str(PRIVATE_PORT),
            "unix_socket_directories": os.fspath(work),
            **CUT_OFF,
            "ssl": "off",
            "logging_collector": "off",
            "shared_buffers": "128MB",
            "max_connections": "20",
        }
        settings.update(options or {})
        with install.server(
            datadir,
            options=settings,
            user=owner,
            log_path=work / "postgres.log",
            timeout=timeout,
            stop_timeout=stop_timeout,
        ):
            yield Running(socket_dir=work, port=PRIVATE_PORT, datadir=datadir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
