"""A branch's server configuration: the settings pgoverlay imposes, which outrank the base's own
files (they go on the command line), and the branch's own configuration files."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.runner import safefs
from pgoverlay.runner.names import ACCESS_ROLE, check_hba_name
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.runtime import Layout
from pgoverlay.runner.units import memory_bytes

if TYPE_CHECKING:
    from pgoverlay.runner.settings import Settings

# How the server writes its log: the engine's trace reads it back (``pgoverlay.runner.trace``),
# so each line names its time (UTC, milliseconds), process and session's user@database, and
# the messages are Postgres's own English whatever the base's locale.
LOG_OPTIONS = {
    "log_line_prefix": "%m [%p] %q%u@%d ",
    "log_timezone": "UTC",
    "lc_messages": "C",
    "log_min_messages": "warning",
}


def server_options(pool: Pool, lay: Layout, branch: Branch) -> dict[str, str]:
    """Settings passed on the command line: they outrank the base's own configuration files."""
    s = pool.settings
    return {
        "data_directory": os.fspath(lay.data),
        "config_file": os.fspath(lay.conf / "postgresql.conf"),
        "hba_file": os.fspath(lay.conf / "pg_hba.conf"),
        "ident_file": os.fspath(lay.conf / "pg_ident.conf"),
        "port": str(branch.port),
        "listen_addresses": s.listen_address,
        "unix_socket_directories": os.fspath(lay.socket_dir),
        "unix_socket_permissions": "0700",
        **cluster.CUT_OFF,
        **ssl_options(pool),
        "password_encryption": "scram-sha-256",
        "shared_buffers": s.shared_buffers,
        "max_connections": str(s.max_connections),
        "work_mem": s.work_mem,
        "maintenance_work_mem": s.maintenance_work_mem,
        **wal_options(s, wal_segment_bytes(pool.base_dir(branch.base_name, branch.base_version))),
        "logging_collector": "off",
        "log_destination": "stderr",
        **LOG_OPTIONS,
        "cluster_name": f"pgoverlay-{branch.key}",
    }


_SEGMENT = re.compile(r"^[0-9A-F]{24}$")
MiB = 1024 * 1024


def wal_segment_bytes(datadir: Path) -> int | None:
    """The WAL segment size of a (prepared) data directory: the size of a segment in its
    pg_wal (pg_resetwal leaves one), or None when there is none to look at."""
    try:
        with os.scandir(datadir / "pg_wal") as entries:
            for entry in entries:
                if _SEGMENT.match(entry.name) and entry.is_file(follow_symlinks=False):
                    return entry.stat(follow_symlinks=False).st_size
    except (FileNotFoundError, NotADirectoryError):
        pass
    return None


def wal_options(s: Settings, segment_bytes: int | None) -> dict[str, str]:
    """How a branch writes WAL (see runner/settings.py), for a base whose segments are
    ``segment_bytes`` long (bases keep the size they were prepared with): min_wal_size is
    raised to two segments when set lower, as Postgres refuses to start below that."""
    wanted = memory_bytes("min_wal_size", s.min_wal_size)
    min_wal_size = s.min_wal_size
    if segment_bytes and wanted is not None and wanted < 2 * segment_bytes:
        min_wal_size = f"{-(-2 * segment_bytes // MiB)}MB"
    return {
        "min_wal_size": min_wal_size,
        "max_wal_size": s.max_wal_size,
        "wal_init_zero": "on" if s.wal_init_zero else "off",
        "wal_recycle": "on" if s.wal_recycle else "off",
        "checkpoint_timeout": s.checkpoint_timeout,
    }


def ssl_options(pool: Pool) -> dict[str, str]:
    """SSL with the pool's own certificate, or none: the base's certificate paths are
    production's."""
    s = pool.settings
    if s.ssl_cert_file is None or s.ssl_key_file is None:
        return {"ssl": "off"}
    return {
        "ssl": "on",
        "ssl_cert_file": os.fspath(s.ssl_cert_file),
        "ssl_key_file": os.fspath(s.ssl_key_file),
        "ssl_ca_file": "",
        "ssl_crl_file": "",
        "ssl_crl_dir": "",
        "ssl_passphrase_command": "",
    }


def hba(*, user: str, superuser: str, database: str, engine_only: bool = False) -> str:
    """Who may connect: the engine as the base's bootstrap superuser on the private socket, the
    branch login role over TCP with its password, and the credentials granted in the branch
    (members of ``ACCESS_ROLE``: a person's or a preview app's role, see ``grants``) over TCP
    with theirs, to the branch's own database only. Nobody else, whatever the base's roles: a
    base's own roles have no login or password left (``seed.lockdown``), so a role of the base
    that happened to be a member of a role named ``ACCESS_ROLE`` still cannot log in.

    ``engine_only``: the engine alone, while a branch that ran before starts again and its
    roles are made what the registry says (``reconcile``): a role its data still holds (a
    credential revoked while it was suspended) or a password changed in SQL never logs in."""
    for role in (user, superuser, database):
        check_hba_name(role)
    if engine_only:
        return (
            f'local all "{superuser}" trust\n'
            "local all all reject\n"
            "host all all 0.0.0.0/0 reject\n"
            "host all all ::/0 reject\n"
        )
    return (
        # The socket directory is 0700 and owned by the branch's OS user: only that user
        # (and root) reach the trusted socket.
        f'local all "{superuser}" trust\n'
        f'host all "{user}" 0.0.0.0/0 scram-sha-256\n'
        f'host all "{user}" ::/0 scram-sha-256\n'
        f'host "{database}" +{ACCESS_ROLE} 0.0.0.0/0 scram-sha-256\n'
        f'host "{database}" +{ACCESS_ROLE} ::/0 scram-sha-256\n'
        "local all all reject\n"
        "host all all 0.0.0.0/0 reject\n"
        "host all all ::/0 reject\n"
    )


def write_conf(
    pool: Pool,
    lay: Layout,
    *,
    user: str,
    superuser: str,
    database: str,
    engine_only: bool = False,
) -> None:
    files = {
        # The base's own postgresql.conf, if it has one, is kept; the command line outranks it.
        "postgresql.conf": f"include_if_exists '{lay.data / 'postgresql.conf'}'\n",
        "pg_hba.conf": hba(
            user=user, superuser=superuser, database=database, engine_only=engine_only
        ),
        "pg_ident.conf": "",
    }
    # Root's files in root's directory: the branches' user reads them and changes nothing.
    for filename, text in files.items():
        safefs.write_new(lay.conf / filename, text, uid=0, gid=0, mode=0o644)
