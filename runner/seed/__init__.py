"""Seed a base: copy a running server into a new base version, verify it, prepare it.

Seeding is a saga like branch creation: the version is registered as ``seeding`` first, the
copy lands in ``staging/``, and only a prepared, verified copy moves into the root-only
``store/`` and is bound read-only at ``bases/NAME/VERSION``. ``gc`` removes whatever a killed
seed left behind. Its steps, each a fault point for the crash tests: ``seed:registered``,
``seed:restored`` (a dump restored, its server still running), ``seed:copied``,
``seed:prepared``, ``seed:stored``, ``seed:mounted``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgoverlay.errors import (
    BaseMissingError,
    CommandError,
    ConfigError,
    MaskError,
    SeedBusyError,
    SeedError,
    SourcePasswordError,
    SourceUnreachableError,
)
from pgoverlay.runner import proc, safefs
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool, fault, flocks, mounts, release_freed, require_root
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster, postmaster, sqlerror
from pgoverlay.runner.postgres.tools import Tools
from pgoverlay.runner.runtime.choose import tools_for
from pgoverlay.runner.seed import (
    checks,
    credentials,
    durable,
    space,
    tablespaces,
    verify,
    workload,
)
from pgoverlay.runner.seed import source as sourceinfo
from pgoverlay.runner.seed.credentials import Credentials
from pgoverlay.runner.seed.source import SourceInfo, Tablespace
from pgoverlay.runner.seed.steps import Laps
from pgoverlay.runner.service.views import BaseWorkload

if TYPE_CHECKING:  # masking (pydantic's rules among it) is imported only to mask
    from pgoverlay.runner.mask import Progress as MaskProgress
    from pgoverlay.runner.mask.rules import RulesFile
    from pgoverlay.runner.seed.prepare import Prepared

log = logging.getLogger(__name__)

Via = Literal["basebackup", "dump"]
Progress = Callable[[int, int], None]
_PROGRESS = re.compile(r"(\d+)/(\d+) kB")
# What only the steps after the copy use, imported in a thread while the copy runs
# (``_import_meanwhile``): the seed's start then loads only what the checks and the copy need,
# and the rest loads while pg_basebackup waits on the source and the disk.
AFTER_COPY = ("pgoverlay.runner.seed.prepare", "pgoverlay.runner.trace.instrument")
_REFUSED_REPLICATION = (
    "replication connection",
    "must be superuser or replication role",
    "permission denied to start WAL sender",
    "number of requested standby connections exceeds",
)


@dataclass(frozen=True)
class Source:
    """A parsed source DSN. It never holds a password: that comes apart (see ``credentials``)
    and only ever travels in a child's environment or a passfile."""

    conninfo: str
    host: str
    port: str
    user: str
    dbname: str
    password: str | None = field(default=None, repr=False)
    passfile: str | None = None  # a private copy of a libpq passfile (credentials.passfile_copy)

    @classmethod
    def parse(cls, dsn: str) -> Source:
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError:
            raise ConfigError(
                "the source DSN cannot be parsed: use a libpq connection string "
                "('host=db port=5432 user=replicator dbname=app') or a postgresql:// URL"
            ) from None
        if params.get("password") is not None or params.get("passfile") is not None:
            raise ConfigError(
                "the source DSN holds a password (or passfile), and a command line is visible "
                f"to every user of this host in `ps`: remove it from --from and give it by "
                f"{credentials.WAYS}"
            )
        return cls(
            conninfo=make_conninfo("", **{k: v for k, v in params.items() if v is not None}),
            host=str(params.get("host") or "localhost"),
            port=str(params.get("port") or "5432"),
            user=str(params.get("user") or ""),
            dbname=str(params.get("dbname") or params.get("user") or "postgres"),
        )

    def using(self, *, password: str | None = None, passfile: str | None = None) -> Source:
        """This source, reached with ``password`` or the passfile at ``passfile``."""
        return replace(self, password=password, passfile=passfile)

    @property
    def env(self) -> dict[str, str]:
        """What a child program needs to authenticate, for its environment only."""
        if self.password:
            return {"PGPASSWORD": self.password}
        return {"PGPASSFILE": self.passfile} if self.passfile else {}

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(
            self.conninfo,
            password=self.password,
            passfile=self.passfile,
            connect_timeout=15,
            autocommit=True,
        )

    def unreached(
        self, err: psycopg.OperationalError
    ) -> SourcePasswordError | SourceUnreachableError:
        """Our error for a connection to this source that failed with ``err``."""
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else "connection failed"
        if "no password supplied" in reason:
            return SourcePasswordError(
                f"the source {self.label} asks for a password and none was given: give it "
                f"by {credentials.WAYS}"
            )
        return SourceUnreachableError(
            f"cannot reach the source {self.label}: {reason}; check the DSN, the network "
            "and the source's pg_hba.conf"
        )

    def inspect(self) -> SourceInfo:
        """What the seed checks before copying anything (see runner/seed/source.py)."""
        try:
            with self.connect() as conn:
                return sourceinfo.inspect(conn)
        except psycopg.OperationalError as err:
            raise self.unreached(err) from None
        except psycopg.Error as err:
            raise SeedError(
                f"cannot read what the seed checks from the source {self.label}: "
                f"{sqlerror.reason(err)}; connect as a role that may read pg_settings and "
                "pg_extension (a superuser, or a member of pg_read_all_settings)"
            ) from None


def _import_meanwhile(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` in a thread, started now; join it before using them. A module that
    fails to import is left for the seed's own import to fail on, with its error."""

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # raised again by the seed's own import of it
                return

    thread = threading.Thread(target=load, name="seed-imports", daemon=True)
    thread.start()
    return thread


def _own(pool: Pool, path: Path) -> None:
    """Make ``path``, in root's staging/, for the Postgres user (pg_basebackup writes it)."""
    safefs.make_dir(path, uid=pool.owner.uid, gid=pool.owner.gid, mode=0o700)


def _basebackup(
    pool: Pool,
    install: Tools,
    src: Source,
    target: Path,
    spaces: list[Tablespace],
    progress: Progress | None,
    laps: Laps,
) -> dict[str, verify.Read]:
    """Copy the source into ``target`` with pg_basebackup; returns what the watching thread
    checksummed of the copy while it was made (``_verify_copy`` checks the rest)."""

    def on_line(line: str) -> None:
        match = _PROGRESS.search(line)
        if match and progress is not None:
            progress(int(match.group(1)) * 1024, int(match.group(2)) * 1024)

    roots = [(target, "")]
    if spaces:
        roots.append((tablespaces.staging_root(target), "pg_tblspc"))
    try:
        with verify.Watch(roots) as watch:
            install.run_streaming(
                "pg_basebackup",
                [
                    "-D",
                    target,
                    "-d",
                    src.conninfo,
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    # the size estimate --progress needs is a walk of the source's files first
                    *(["--progress"] if progress is not None else []),
                    "--no-password",
                    # Not a fsync per file (each one a flush of the pool image's disk): the
                    # seed flushes the copy while it is verified and prepared, and syncs the
                    # base once before declaring it ready (durable.py).
                    "--no-sync",
                    *tablespaces.mapping_args(spaces, tablespaces.staging_root(target)),
                ],
                timeout=pool.settings.command_timeout,
                on_line=on_line,
                env=src.env,
                user=pool.owner,
            )
    except CommandError as err:
        if any(marker in err.stderr for marker in _REFUSED_REPLICATION):
            raise SourceUnreachableError(
                f"the source {src.label} refuses replication connections "
                f"({proc.last_lines(err.stderr, 1)}): "
                "grant the user REPLICATION and allow it in pg_hba.conf, or seed with --via dump"
            ) from None
        raise SeedError(
            f"pg_basebackup from {src.label} failed: {proc.last_lines(err.stderr)}"
        ) from None
    laps.lap("copy")
    return watch.reads


def _verify_copy(
    pool: Pool, install: Tools, target: Path, reads: dict[str, verify.Read], *, spaces: bool
) -> None:
    """Verify the copy as pg_verifybackup would: its tree and WAL by pg_verifybackup
    (``--skip-checksums``), the data's checksums here, against the manifest, reading only the
    files the watch did not (``reads``). The two run side by side, on the two cores, unless
    the copy has tablespaces: those are moved into the data directory between the two."""
    if spaces:
        _verify_tree_and_wal(pool, install, target)
        tablespaces.make_in_place(target, tablespaces.staging_root(target))
        read_after = verify.check(target, reads)
    else:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="seed-verifybackup") as side:
            tree_and_wal = side.submit(_verify_tree_and_wal, pool, install, target)
            tablespaces.make_in_place(target, tablespaces.staging_root(target))
            try:
                read_after = verify.check(target, reads)
            finally:
                tree_and_wal.result()  # its error first: it says what is wrong more broadly
    log.debug("verify: %s files checksummed during the copy, %s after it", len(reads), read_after)


def _check_copied_libraries(install: Tools, datadir: Path, *, owner: proc.OsUser) -> None:
    """The check the source's role could not make before the copy (``shared_preload_libraries``
    needs pg_read_all_settings), made on the copy's own files: ``postgres -C`` prints what they
    set without starting a server. The files the base will run with: its postgresql.conf, if
    the source kept one in its data directory, and its postgresql.auto.conf."""
    conf = datadir / "postgresql.conf"
    args: list[str | os.PathLike[str]] = ["-C", "shared_preload_libraries", "-D", datadir]
    if not conf.is_file():
        args += ["-c", "config_file=/dev/null"]
    try:
        value = install.run("postgres", args, timeout=60, user=owner).stdout.strip()
    except CommandError as err:
        log.warning(
            "the copy's shared_preload_libraries could not be read (%s): the libraries it "
            "preloads are checked when the copy starts",
            proc.last_lines(err.stderr, 1),
        )
        return
    checks.check_libraries(
        sourceinfo.libraries([value]),
        checks.available_libraries(install),
        major=install.major,
        where=install.where,
    )


def _verify_tree_and_wal(pool: Pool, install: Tools, target: Path) -> None:
    """What pg_verifybackup checks besides the data's checksums (``verify`` does those, during
    the copy): the manifest's own checksum, every file present with its size and no extra
    one, and the WAL from the backup's start to its end, parsed by pg_waldump."""
    try:
        install.run(
            "pg_verifybackup",
            ["--quiet", "--skip-checksums", target],
            timeout=pool.settings.command_timeout,
            user=pool.owner,
        )
    except CommandError as err:
        raise SeedError(
            f"the copy failed verification ({proc.last_lines(err.stderr)}); it is removed: "
            "seed again"
        ) from None


def _dump_restore(pool: Pool, install: Tools, src: Source, target: Path) -> str:
    """Restore a logical dump of the source's database into a fresh cluster at ``target``."""
    cluster.initdb(install, target, owner=pool.owner)
    with cluster.running(install, target, owner=pool.owner, scratch=pool.tmp) as srv:
        # A file, not a pipe: the next program may run in a container. Role passwords are left
        # out, so it holds no secret; it lives in the server's private directory.
        globals_sql = srv.socket_dir / "globals.sql"
        install.run(
            "pg_dumpall",
            [
                "--globals-only",
                "--no-role-passwords",
                # A tablespace's location is a path on the source host: never create it here.
                "--no-tablespaces",
                "-d",
                src.conninfo,
                "--no-password",
                "-f",
                globals_sql,
            ],
            timeout=pool.settings.command_timeout,
            env=src.env,
            user=pool.owner,
        )
        local = ["-h", os.fspath(srv.socket_dir), "-p", str(srv.port), "-U", "postgres"]
        # Roles that already exist (the bootstrap superuser) fail harmlessly: no ON_ERROR_STOP.
        install.run(
            "psql",
            ["-X", "-q", *local, "-d", "postgres", "-f", globals_sql],
            timeout=pool.settings.command_timeout,
            user=pool.owner,
        )
        dump = srv.socket_dir / "source.dump"
        install.run(
            "pg_dump",
            ["-Fc", "-f", dump, "-d", src.conninfo, "--no-password"],
            timeout=pool.settings.command_timeout,
            env=src.env,
            user=pool.owner,
        )
        install.run(
            "pg_restore",
            [
                "--create",
                "--exit-on-error",
                "--no-tablespaces",
                *local,
                "-d",
                "postgres",
                dump,
            ],
            timeout=pool.settings.command_timeout,
            user=pool.owner,
        )
        fault(pool, "seed:restored")
    return "postgres"


def seed(
    pool: Pool,
    name: str,
    *,
    source_dsn: str,
    auth: Credentials = credentials.NONE,
    ask_password: Callable[[str], str] | None = None,
    refresh: bool = False,
    via: Via = "basebackup",
    progress: Progress | None = None,
    mask: Path | None = None,
    mask_progress: MaskProgress | None = None,
    allow_unmasked: bool = False,
    runtime: str | None = None,
    laps: Laps | None = None,
    workload_top: int | None = None,
) -> BaseVersion:
    """Seed base ``name`` from ``source_dsn``, authenticating with ``auth``; with ``mask``, a
        rules file applied while the base is prepared. Refreshing a masked base needs ``mask``
        again, or ``allow_unmasked``; ``mask_progress`` is told of each masking step.
        ``ask_password`` (given the source's label) is called once
        when the source wants a password and ``auth`` holds none: a prompt on a terminal. ``laps``,
    when given, gets the seconds each step took. The source's ``workload_top`` statements are
    kept with the version (``workload``; None: ``workload.DEFAULT_TOP``, 0: none)."""
    laps = Laps() if laps is None else laps
    check_name(name, what="base")
    workload_top = workload.check_top(workload_top)
    require_root()  # the base is bind-mounted read-only
    src = Source.parse(source_dsn)
    rules = None
    if mask is not None:
        from pgoverlay.runner.mask import rules as maskrules

        rules = maskrules.load(mask)
    with (
        flocks.locked(
            pool.lock_path("seed", name), timeout=0, what=f"seeding base {name}", busy=SeedBusyError
        ),
        credentials.passfile_copy(auth, scratch=pool.tmp, owner=pool.owner) as passfile,
    ):
        existing = pool.registry.latest_base(name)
        if existing is not None and not refresh:
            raise SeedError(
                f"base {name} already exists (version {existing.version}): pass --refresh "
                "to seed a new version, or pick another name"
            )
        if existing is not None and existing.masked and rules is None and not allow_unmasked:
            raise MaskError(
                f"base {name} version {existing.version} is masked by {existing.mask_label}: "
                "pass --mask RULES to mask the new version too, or --no-mask to seed it "
                "with the source's data as it is"
            )
        src = src.using(password=auth.password, passfile=passfile)
        try:
            info = src.inspect()
        except SourcePasswordError:
            if ask_password is None or auth.given:
                raise
            src = src.using(password=ask_password(src.label))
            info = src.inspect()
        if info.major < pgbin.MIN_MAJOR:
            raise SeedError(
                f"the source runs Postgres {info.major}; pgoverlay needs {pgbin.MIN_MAJOR} or newer"
            )
        install = tools_for(
            "seed",
            pool=pool,
            major=info.major,
            requested=runtime,
            base_name=name,
            # A source on a Unix socket of this host: its directory, for a container to reach.
            mounts=[Path(src.host)] if src.host.startswith("/") else [],
        )
        for line in checks.unread_warnings(info):
            log.warning("%s", line)
        check_source(install, info, database=src.dbname)
        # A dump is restored into a fresh cluster: none of the source's settings come along.
        for line in checks.override_warnings(info, pool.settings) if via == "basebackup" else []:
            log.warning("%s", line)
        spaces = [t for t in info.tablespaces if t.outside]
        if spaces and via == "dump":
            log.warning(
                "the source has tablespaces (%s): a dump is restored without them, so every "
                "table of the base is in the default tablespace",
                ", ".join(t.name for t in spaces),
            )
        if rules is not None:
            check_rules_on_source(src, rules)
        check_space(pool, src, rules, base=name, via=via)
        laps.lap("checks")
        captured = capture_workload(src, name, top=workload_top)
        laps.lap("workload")
        return _seed_version(
            pool,
            name,
            src,
            install,
            info,
            via=via,
            progress=progress,
            rules=rules,
            mask_progress=mask_progress,
            laps=laps,
            captured=captured,
        )


def capture_workload(src: Source, base: str, *, top: int) -> BaseWorkload | None:
    """The source's workload (``workload.capture``), or None when ``top`` is 0 or none could
    be read: that is said in one line, and the seed goes on."""
    if top == 0:
        return None
    try:
        with src.connect() as conn:
            found = workload.capture(conn, top=top, source=f"{src.label} {src.dbname}", base=base)
    except psycopg.OperationalError as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else "connection failed"
        log.warning("no workload captured: cannot reach the source %s (%s)", src.label, reason)
        return None
    if found.note:
        log.warning("%s", found.note)
    return found if found.captured_at else None


def refresh_workload(
    pool: Pool,
    name: str,
    *,
    source_dsn: str | None = None,
    file: Path | None = None,
    auth: Credentials = credentials.NONE,
    ask_password: Callable[[str], str] | None = None,
    top: int | None = None,
) -> BaseWorkload:
    """Give or refresh the workload of base ``name``'s newest ready version, from a running
    source (``source_dsn``, authenticated as a seed is) or an export (``file``), without
    seeding again. Under the base's lock: a removal or a seed of it waits for none."""
    check_name(name, what="base")
    require_root()  # the workload is root's alone
    top = workload.check_top(top)
    if top == 0:
        raise ConfigError(f"--top 0 would keep no statement: give 1 to {workload.MAX_TOP}")
    if (source_dsn is None) == (file is None):
        raise ConfigError("base workload needs exactly one of --from DSN or --file PATH")
    src = Source.parse(source_dsn) if source_dsn is not None else None
    with (
        flocks.locked(
            pool.lock_path("seed", name), timeout=0, what=f"base {name}", busy=SeedBusyError
        ),
        credentials.passfile_copy(auth, scratch=pool.tmp, owner=pool.owner) as passfile,
    ):
        ready = [b for b in pool.registry.bases(name) if b.state == "ready"]
        if not ready:
            raise BaseMissingError(
                f"base {name} has no ready version to keep a workload with: seed it first "
                f"(`pgoverlay base seed {name} --from DSN`); see `pgoverlay base list`"
            )
        version = ready[-1].version
        if src is None:
            assert file is not None
            found = workload.from_file(file, top=top)
        else:
            src = src.using(password=auth.password, passfile=passfile)
            try:
                found = _capture_from(src, name, top)
            except SourcePasswordError:
                if ask_password is None or auth.given:
                    raise
                found = _capture_from(src.using(password=ask_password(src.label)), name, top)
            if not found.captured_at:
                raise SeedError(found.note)
        kept = workload.named(found, name, version)
        workload.keep(pool.workload_file(name, version), kept)
    return kept


def _capture_from(src: Source, name: str, top: int) -> BaseWorkload:
    """``workload.capture`` on a session of ``src``; its connection's failure as a seed's."""
    try:
        with src.connect() as conn:
            return workload.capture(conn, top=top, source=f"{src.label} {src.dbname}", base=name)
    except psycopg.OperationalError as err:
        raise src.unreached(err) from None


def check_source(install: Tools, info: SourceInfo, *, database: str) -> None:
    """Refuse a source whose branches could not run with this runner's Postgres."""
    where = install.where
    checks.check_libraries(
        info.libraries, checks.available_libraries(install), major=install.major, where=where
    )
    checks.check_extensions(
        info.extensions,
        checks.available_extensions(install),
        major=install.major,
        database=database,
        where=where,
    )


def check_space(pool: Pool, src: Source, rules: RulesFile | None, *, base: str, via: Via) -> None:
    """Refuse, before copying anything, a seed the pool has no room for (see seed/space.py)."""
    try:
        with src.connect() as conn:
            sizes = space.measure(conn, rules.rules if rules else None)
    except psycopg.OperationalError:
        return  # reached a moment ago: the copy will say what is wrong
    if sizes is None:
        return
    free = shutil.disk_usage(pool.root).free
    if pool.info.mode == "image":  # a sparse image: the host's disk must hold its growth too
        free = min(free, shutil.disk_usage(pool.home).free)
    found = space.estimate(sizes, rules.rules if rules else None, dump=via == "dump")
    log.debug("the seed needs about %s bytes; the pool has %s free", found.total, free)
    space.check(found, free_bytes=free, base=base)


def check_rules_on_source(src: Source, rules: RulesFile) -> None:
    """Fail fast, before copying anything, when the rules do not fit the source's schema."""
    from pgoverlay.runner.mask import schema as maskcheck

    try:
        with src.connect() as conn:
            maskcheck.check(
                conn,
                rules.rules,
                rules_name=rules.name,
                where=f"the source's database {src.dbname} ({src.label})",
            )
    except psycopg.OperationalError as err:
        raise SourceUnreachableError(
            f"cannot reach the source {src.label} to check the masking rules: "
            f"{str(err).strip().splitlines()[-1] if str(err).strip() else 'connection failed'}"
        ) from None
    except psycopg.Error as err:
        raise MaskError(
            f"cannot check the masking rules {rules.name} on the source {src.label}: "
            f"{sqlerror.reason(err)}; connect as a role that may read the catalogs of database "
            f"{src.dbname}"
        ) from None


def _seed_version(
    pool: Pool,
    name: str,
    src: Source,
    install: Tools,
    info: SourceInfo,
    *,
    via: Via,
    progress: Progress | None,
    rules: RulesFile | None,
    mask_progress: MaskProgress | None = None,
    laps: Laps,
    captured: BaseWorkload | None = None,
) -> BaseVersion:
    version = pool.registry.add_base_version(name, source=src.label, via=via)
    fault(pool, "seed:registered")
    staging = pool.staging_dir(name, version)
    importing = _import_meanwhile(AFTER_COPY)
    try:
        _own(pool, staging)
        spaces = [t for t in info.tablespaces if t.outside]
        reads: dict[str, verify.Read] = {}  # what the watch checksummed during the copy
        if via == "basebackup":
            if spaces:
                _own(pool, tablespaces.staging_root(staging))
            reads = _basebackup(pool, install, src, staging, spaces, progress, laps)
            candidates = [src.user]
        else:
            candidates = [_dump_restore(pool, install, src, staging)]
        importing.join()
        from pgoverlay.runner.seed import prepare  # loaded meanwhile, by the thread

        # The copy's flush starts now, while it is verified and the server prepares it (the
        # disk's work beside the CPU's; see durable.py).
        with durable.flushing(staging):
            if via == "basebackup":
                _verify_copy(pool, install, staging, reads, spaces=bool(spaces))
                laps.lap("verify")
                if "shared_preload_libraries" in info.unreadable:
                    _check_copied_libraries(install, staging, owner=pool.owner)
                lsn = prepare.start_lsn(staging)
            else:
                lsn = ""
            fault(pool, "seed:copied")
            result = prepare.prepare(
                install,
                staging,
                owner=pool.owner,
                scratch=pool.tmp,
                login_candidates=candidates,
                database=src.dbname,
                branch_user=pool.settings.branch_user,
                branch_superuser=pool.settings.branch_superuser,
                branch_createrole=pool.settings.branch_createrole,
                wal_segsize_mb=pool.settings.wal_segsize_mb,
                timeout=pool.settings.command_timeout,
                masking=rules,
                mask_progress=mask_progress,
                laps=laps,
            )
        laps.lap("flush")
        _say_prepared(pool, src, result)
        fault(pool, "seed:prepared")
        store = pool.store_dir(name, version)
        store.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(store)
        fault(pool, "seed:stored")
        target = pool.base_dir(name, version)
        target.mkdir(parents=True, exist_ok=True)
        mounts.bind_readonly(store, target)
        fault(pool, "seed:mounted")
        laps.lap("store")
        # On disk before it is declared ready: what the flush during the preparation did not
        # write (the preparation's changes, masking's removals, the move into the store).
        durable.syncfs(store)
        laps.lap("sync")
        if captured is not None:  # before it is ready: a failed seed removes it with the rest
            workload.keep(
                pool.workload_file(name, version), workload.named(captured, name, version)
            )
        pool.registry.update_base(
            name,
            version,
            state="ready",
            pg_major=install.major,
            start_lsn=lsn,
            size_bytes=result.size_bytes,
            superuser=result.superuser,
            database=src.dbname,
            owner_uid=pool.owner.uid,
            prepared_at=time.time(),
            source_role="standby" if info.standby else "primary",
            source_settings=json.dumps(info.settings, sort_keys=True),
            tablespaces=",".join(t.name for t in spaces) if via == "basebackup" else "",
            mask_rules=rules.name if rules else "",
            mask_sha256=rules.sha256 if rules else "",
            neutralised=json.dumps(list(result.neutralised)),
        )
    except BaseException:
        log.warning("seeding %s version %s failed; removing it", name, version)
        remove_version(pool, name, version)
        raise
    laps.lap("register")
    release_freed(pool)  # the staging copy's blocks: before masking, they held the originals
    laps.lap("release")
    log.debug("seed of %s version %s: %s", name, version, laps.summary())
    found = pool.registry.base(name, version)
    assert found is not None
    return found


def _say_prepared(pool: Pool, src: Source, result: Prepared) -> None:
    """Refuse a base without the DSN's database, and warn of what the preparation found: tables
    a superuser owns, what it neutralised, the databases masking did not keep."""
    if src.dbname not in result.databases:
        raise SeedError(
            f"database {src.dbname!r} from the DSN is not in the base "
            f"(it has: {', '.join(result.databases)}); fix dbname in the DSN"
        )
    if result.superuser_tables and not pool.settings.branch_superuser:
        log.warning(
            "%s tables, views or sequences in %s are owned by superuser %s: migrations run "
            "as a non-superuser and cannot alter them; give them a non-superuser owner in "
            "the source, or set PGOVERLAY_BRANCH_SUPERUSER=true (the PR's SQL then runs "
            "with full rights on the runner)",
            result.superuser_tables,
            src.dbname,
            result.superuser,
        )
    for note in result.neutralised:
        log.warning("neutralised in the base: %s", note)
    if result.dropped_databases:
        log.warning(
            "the masked base keeps only database %s; not kept: %s",
            src.dbname,
            ", ".join(result.dropped_databases),
        )


def remove_version(pool: Pool, name: str, version: int) -> None:
    """Remove every trace of one base version. Idempotent."""
    staging = pool.staging_dir(name, version)
    if staging.exists():
        postmaster.stop(staging / "postmaster.pid", timeout=pool.settings.stop_timeout)
    target = pool.base_dir(name, version)
    mounts.unmount(target)
    for path in (
        staging,
        tablespaces.staging_root(staging),
        pool.store_dir(name, version),
        target,
        pool.schema_file(name, version),
        pool.workload_file(name, version),
    ):
        with contextlib.suppress(OSError):
            safefs.remove_tree(path)
    pool.registry.delete_base(name, version)
    release_freed(pool)
