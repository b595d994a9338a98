"""The composite Action's entry point: read the job's environment, run the PR workflow, write
masks, outputs, annotations and the job summary. Called as `pgoverlay action run`.

It runs as the runner's own user, with no privilege of its own: branches come from the engine
service (for members of its group), and everything the job names (its workspace, event file,
output and summary files) is read, written or run with this user's rights alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from pgoverlay.action import comment, event, outputs
from pgoverlay.action import markdown as md
from pgoverlay.action.conclusion import conclude
from pgoverlay.action.decide import as_work, fork_refusal
from pgoverlay.action.github import GitHub
from pgoverlay.action.insight import jsonreport
from pgoverlay.action.report import Report
from pgoverlay.action.request import Inputs, read_inputs
from pgoverlay.action.wayin import WayIn
from pgoverlay.action.workflow import Outcome, handle
from pgoverlay.errors import (
    GitHubError,
    JobFileError,
    Location,
    PgoverlayError,
    Problems,
    UnsafeFileError,
    config_error,
)
from pgoverlay.github.grammar import API_URL, WEB_URL
from pgoverlay.runner import safefs
from pgoverlay.runner.names import check_name
from pgoverlay.runner.service import client as service
from pgoverlay.runner.service.models import GrantRequest
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.settings import load as load_settings

if TYPE_CHECKING:
    from pgoverlay.runner.service.engine import Engine


@dataclass(frozen=True, kw_only=True)
class JobEnv:
    """The variables GitHub Actions sets for every step, and the Action's token input:
    ``from_environ`` reads them (a plain dataclass: importing pydantic would cost every step
    more than the rest of its start-up)."""

    # Each field's variables, the first one set wins (a field may be given by its own name
    # too, as the pydantic model this was allowed); a field with no default must be set.
    VARIABLES: ClassVar[dict[str, tuple[str, ...]]] = {
        "event_path": ("GITHUB_EVENT_PATH",),
        "event_name": ("GITHUB_EVENT_NAME",),
        "repository": ("GITHUB_REPOSITORY",),
        "api_url": ("GITHUB_API_URL",),
        "server_url": ("GITHUB_SERVER_URL",),
        "run_id": ("GITHUB_RUN_ID",),
        "sha": ("GITHUB_SHA",),
        "ref": ("GITHUB_REF",),
        "workspace": ("GITHUB_WORKSPACE",),
        "output": ("GITHUB_OUTPUT",),
        "summary": ("GITHUB_STEP_SUMMARY",),
        "temp": ("RUNNER_TEMP",),
        "token": ("INPUT_GITHUB_TOKEN", "GITHUB_TOKEN"),
        "server": ("INPUT_SERVER",),
        "server_ca": ("INPUT_SERVER_CA",),
    }

    event_path: Path
    event_name: str
    repository: str
    api_url: str = API_URL
    server_url: str = WEB_URL
    run_id: str = ""
    sha: str = ""
    ref: str = ""
    workspace: Path = Path(".")
    output: Path | None = None
    summary: Path | None = None
    temp: Path | None = None
    token: str = field(default="", repr=False)
    # The pool's API (the `server` input): empty, the engine service on this host.
    server: str = ""
    server_ca: str = ""  # PEM of the certificate to trust for it, or a file's path

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        """The job's variables from ``environ`` (default: this process's environment); a
        ConfigError names the first one missing (and how many more are)."""
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {}
        missing: list[tuple[Location, str]] = []
        for f in fields(cls):
            names = (*cls.VARIABLES[f.name], f.name)
            found = next((env[name] for name in names if name in env), None)
            if found is not None:
                given[f.name] = Path(found) if "Path" in str(f.type) else found
            elif f.default is MISSING:
                missing.append(((names[0],), "Field required"))
        if missing:
            raise config_error(
                Problems(missing),
                what="job variable",
                fix="is this step running inside GitHub Actions?",
            )
        return cls(**given)

    def run_url(self) -> str:
        return (
            f"{self.server_url}/{self.repository}/actions/runs/{self.run_id}" if self.run_id else ""
        )


MAX_EVENT_BYTES = 25 * 1024 * 1024  # GitHub caps a webhook payload at 25 MB


def _outputs(
    engine: Engine,
    settings: Settings,
    outcome: Outcome,
    out: TextIO,
    *,
    app_rootcert: str | None = None,
) -> dict[str, str]:
    report = outcome.report
    values = {
        "status": report.status if report else "skipped",
        "branch": report.branch_name if report else "",
    }
    b, c = outcome.branch, outcome.connection
    if b is None or c is None or report is None or report.status == "destroyed":
        return values
    outputs.mask(c.password, out)
    outputs.mask(c.url, out)
    layer = engine.size(b.name)  # now, not when the report was first made
    applied = 0 if outcome.reused else sum(m.status == "applied" for m in report.migrations)
    values.update(
        {
            "host": c.host,
            "port": str(c.port),
            "database": c.database,
            "user": c.user,
            "password": c.password,
            "dsn": c.url,
            "layer-bytes": str(layer.logical_bytes),
            "layer-physical-bytes": str(layer.physical_bytes),
            "migrations-applied": str(applied),
        }
    )
    url = database_url(
        engine, settings, b.name, repository=report.repository, out=out, sslrootcert=app_rootcert
    )
    if url is not None:
        values["database-url"] = url
    return values


def database_url(
    engine: Engine,
    settings: Settings,
    name: str,
    *,
    repository: str,
    out: TextIO,
    sslrootcert: str | None = None,
) -> str | None:
    """The `database-url` output: branch ``name`` through the front door, as the pull
    request's application role with its one password, which each run renews (the engine keeps
    it for the branch's life, so a preview deployed by an earlier run keeps working; the role
    goes with the branch). Its password and the URL are registered as
    secrets with the runner (``::add-mask::``) before anything is written. None, with a
    warning, when the engine will not grant one: the run goes on without it. It verifies the
    door (``door.dsn``) against ``sslrootcert``, a file on this runner the job's next steps can
    read (a pool reached over the network: its `server-ca`, or this runner's trusted bundle);
    by default the system's store, or the path of the door's own certificate on this host."""
    try:
        granted = engine.grant(name, GrantRequest(app=True, repository=repository))
    except PgoverlayError as err:
        outputs.annotation("warning", str(err), out, title="No database-url output")
        return None
    if granted.password is None:  # an engine answers a grant with its password
        outputs.annotation(
            "warning", "the engine answered without a password", out, title="No database-url output"
        )
        return None
    outputs.mask(granted.password, out)
    door = WayIn(
        page=settings.page_url(name),
        host=granted.dsn_host,
        port=granted.dsn_port,
        database=granted.database,
        sslmode="verify-full",
        sslrootcert=sslrootcert or _local_rootcert(settings),
    )
    url = door.url(granted.role, granted.password)
    outputs.mask(url, out)
    return url


def _local_rootcert(settings: Settings) -> str:
    """What a program on this host verifies the door with: the system's store, or the door's
    own certificate where the door keeps it (root's, readable by all)."""
    from pgoverlay.runner.door import dsn, tls

    if settings.door_rootcert != dsn.CERT_DOWNLOAD:
        return settings.door_rootcert
    return os.fspath(settings.home / "door" / tls.CERT_NAME)


def started_seconds(environ: Mapping[str, str], now: float) -> float | None:
    """Seconds from the step's start (run.sh sets PGOVERLAY_STEP_STARTED, bash's
    EPOCHREALTIME) to ``now``: the interpreter's start and the imports. None if not set."""
    try:
        return max(0.0, now - float(environ["PGOVERLAY_STEP_STARTED"].replace(",", ".")))
    except (KeyError, ValueError):
        return None


def timings_line(start: float | None, timings: Mapping[str, float]) -> str:
    """Where the step's time went, in its log: `pgoverlay: timings: start 0.21 s, branch ...`."""
    parts = [] if start is None else [f"start {start:.2f} s"]
    parts += [f"{phase} {seconds:.2f} s" for phase, seconds in timings.items()]
    return "pgoverlay: timings: " + ", ".join(parts)


def run(*, out: TextIO = sys.stdout, destroy: bool = False) -> int:
    """Everything comes from the job's environment, as GitHub Actions sets it."""
    start = started_seconds(os.environ, time.time())
    began = time.monotonic()
    job = JobEnv.from_environ()
    inputs = read_inputs(dict(os.environ))
    payload = read_event(job.event_path)
    ev = event.parse(job.event_name, payload, repository=job.repository, sha=job.sha, ref=job.ref)
    if destroy:
        ev = dataclasses.replace(ev, kind="close")
    if os.geteuid() == 0:
        outputs.annotation(
            "warning",
            "this job runs as root, so the pull request's code does too: run the runner as an "
            "ordinary user in the `pgoverlay` group (docs/action.md)",
            out,
            title="pgoverlay",
        )
    settings = load_settings()
    if job.server.strip():
        return _run_on_server(job, settings, ev, inputs, out, start=start, began=began)
    # The engine is the service's: this job (and the pull request's code in it) runs as the
    # runner's own user, never as root.
    engine = service.client(settings)
    return _run(
        engine, settings, job, ev, inputs, out, start=start, began=began,
        door=_door_answers(settings),
    )  # fmt: skip


def _door_answers(settings: Settings) -> bool:
    """Whether this host's front door answers: the report points a reader at it only then."""
    from pgoverlay.runner.door.reach import answering

    return answering(settings)


def _run_on_server(
    job: JobEnv,
    settings: Settings,
    ev: event.Event,
    inputs: Inputs,
    out: TextIO,
    *,
    start: float | None,
    began: float,
) -> int:
    """The workflow against the pool at ``job.server``, through its network API and its front
    door, as the job's OIDC token's repository: no pool, service or group on this runner. The
    way in the report gives is the server's; the job holds its branch for its whole run, so
    another job of the pull request on another runner waits for it."""
    from pgoverlay.action import jobhold
    from pgoverlay.runner.service import netclient

    server = job.server.strip().rstrip("/")
    ca_file = _server_ca(job)
    # The token is asked for at the first request: a fork's run refused here asks for none.
    credential = netclient.OidcCredential(server, lazy=True)
    engine = netclient.NetworkEngine(
        server, credential=credential, ca_file=ca_file, timeout=settings.command_timeout
    )
    if fork_refusal(ev, inputs) or as_work(ev, inputs).kind not in event.WORK_KINDS:
        return _run(engine, settings, job, ev, inputs, out, start=start, began=began)
    door = engine.pool()
    settings = settings.replace(
        door_host=str(door["door_name"]),
        door_port=int(door["door_port"]),
        door_https_port=int(door["door_https_port"]),
        door_self_signed=door.get("app_sslmode") == "require",  # the pool's own certificate
    )
    name = check_name(event.branch_name(ev, inputs.branch_name))
    done: list[int] = []

    def keep_for_the_job(hold_id: str) -> bool:
        # The job's later steps use the branch its dsn names: the hold lasts until the job
        # ends (action.jobhold), so that another job of the pull request waits to reset it.
        if not done or done[0] != 0 or ev.kind not in ("open", "sync"):
            return False
        return jobhold.hand_over(engine, name, hold_id, temp=job.temp)

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    held = (
        contextlib.nullcontext()  # an earlier step of this job keeps it for the job
        if jobhold.kept_by_this_job(engine, name, temp=job.temp)
        else engine.hold(name, wait=settings.command_timeout, waiting=say, keep=keep_for_the_job)
    )
    with held:
        # Jobs of one pull request may run on several runners, in any order: under the hold,
        # a job whose head is no longer the pull request's leaves the branch, the comment and
        # the deployment to the newer head's job (the listener asks the same of the API).
        newer = _newer_head(job, ev, out)
        if newer is not None:
            return _stale(job, ev, newer, out)
        done.append(
            _run(
                engine,
                settings,
                job,
                ev,
                inputs,
                out,
                start=start,
                began=began,
                app_rootcert=netclient.trust_file(ca_file),
            )
        )
    return done[0]


def _newer_head(job: JobEnv, ev: event.Event, out: TextIO) -> str | None:
    """The pull request's head now, when it is not ``ev``'s (None: it is, or the pull request
    is closing, gone, or cannot be asked about: then the job goes on, and says so)."""
    if ev.pr is None or ev.kind not in ("open", "sync") or not ev.head_sha:
        return None
    if not job.token:
        outputs.annotation(
            "warning",
            "no github-token: this job cannot tell whether its head is still the pull "
            "request's, so an older head that runs last may overwrite a newer one's branch",
            out,
            title="pgoverlay",
        )
        return None
    github = GitHub(job.token, api_url=job.api_url)
    try:
        pull = github.pull(ev.repository, ev.pr)
    except GitHubError as err:
        outputs.annotation(
            "warning",
            f"could not ask GitHub for the pull request's head ({err}); going on with this "
            "job's",
            out,
            title="pgoverlay",
        )
        return None
    finally:
        github.close()
    head = (pull or {}).get("head") or {}
    sha = head.get("sha") if isinstance(head, dict) else None
    return sha if isinstance(sha, str) and sha and sha != ev.head_sha else None


def _stale(job: JobEnv, ev: event.Event, newer: str, out: TextIO) -> int:
    """This job's head was replaced by ``newer``: it does nothing, and says so."""
    message = (
        f"this job's head {ev.head_sha[:7]} is no longer the head of pull request #{ev.pr} "
        f"(now {newer[:7]}): the newer head's job makes its branch, comment and deployment; "
        "this one changed nothing"
    )
    outputs.annotation("notice", message, out, title="A newer head")
    outputs.write_outputs(job.output, {"status": "skipped", "branch": ""})
    outputs.write_summary(job.summary, f"### pgoverlay\n\nSkipped: {message}.\n")
    return 0


def _server_ca(job: JobEnv) -> Path | None:
    """The `server-ca` input as a file: PEM text is written to RUNNER_TEMP (this user's, mode
    0600); anything else is the path of a file. None: the system's trusted CAs."""
    given = job.server_ca.strip()
    if not given:
        return None
    if given.startswith("-----BEGIN"):
        if job.temp is None:
            raise JobFileError("server-ca: RUNNER_TEMP is not set, so there is nowhere to keep it")
        return outputs.write_new(
            job.temp,
            given + "\n",
            prefix="pgoverlay-server-ca-",
            suffix=".pem",
            variable="RUNNER_TEMP",
        )
    path = Path(given)
    return path if path.is_absolute() else job.workspace / path


def read_event(path: Path) -> dict[str, Any]:
    """The event's payload, read as this user (``{}`` when the runner wrote no file)."""
    if not path.exists():
        return {}
    try:
        raw = safefs.read_regular(path, limit=MAX_EVENT_BYTES, what=f"GITHUB_EVENT_PATH={path}")
    except UnsafeFileError as err:
        raise JobFileError(
            f"{err}. GitHub Actions sets GITHUB_EVENT_PATH to the job's event file: do not "
            "change it in the workflow"
        ) from None
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise JobFileError(
            f"GITHUB_EVENT_PATH={path} is not a JSON object, so not an event GitHub Actions "
            "wrote: do not change GITHUB_EVENT_PATH in the workflow"
        )
    return payload


def _not_branched(job: JobEnv, report: Report, out: TextIO, *, fork: bool) -> int:
    """A pull request that gets no branch (a ``fork``'s without `allow-forks`, or one
    `branch-when` does not want): say why in the summary; nothing was made."""
    title = "No branch for a fork" if fork else "No branch for this pull request"
    outputs.annotation("notice", report.message, out, title=title)
    values = {"status": "skipped", "branch": "", **_report_file(job, report)}
    outputs.write_outputs(job.output, values)
    outputs.write_summary(job.summary, comment.render_summary(report))
    return 0


def _run(
    engine: Engine,
    settings: Settings,
    job: JobEnv,
    ev: event.Event,
    inputs: Inputs,
    out: TextIO,
    *,
    start: float | None = None,
    began: float | None = None,
    app_rootcert: str | None = None,
    door: bool = True,
) -> int:
    # Before any work: a step that cannot report what it did must not make a branch.
    outputs.check_writable(job.output, variable="GITHUB_OUTPUT")
    outputs.check_writable(job.summary, variable="GITHUB_STEP_SUMMARY")
    outputs.check_folder(job.temp, variable="RUNNER_TEMP")
    wanted = inputs.comment or inputs.deployment
    github = GitHub(job.token, api_url=job.api_url) if job.token and wanted else None
    handled = time.monotonic()
    # Where the step's time goes, in its log: before the work, the work's phases, the engine
    # service's other answers (the branch, its base, its record), and the report.
    timings = {"prepare": handled - began} if began is not None else {}
    try:
        outcome = handle(
            engine,
            ev,
            inputs,
            settings=settings,
            fork_commands=inputs.allow_fork_commands,
            refused=fork_refusal(ev, inputs),
            repo_dir=job.workspace.resolve(),
            github=github,
            run_url=job.run_url(),
            echo=lambda line: print(line, file=out, flush=True),
            door=door,
        )
    finally:
        if github is not None:
            github.close()
    done = time.monotonic()
    timings.update(outcome.timings)
    timings["engine"] = max(0.0, done - handled - sum(outcome.timings.values()))
    try:
        return _finish(engine, settings, job, ev, inputs, outcome, out, app_rootcert=app_rootcert)
    finally:
        timings["report"] = time.monotonic() - done
        print(timings_line(start, timings), file=out, flush=True)


def _finish(
    engine: Engine,
    settings: Settings,
    job: JobEnv,
    ev: event.Event,
    inputs: Inputs,
    outcome: Outcome,
    out: TextIO,
    *,
    app_rootcert: str | None = None,
) -> int:
    """The step's outputs, summary, annotations and exit code for what ``handle`` did."""
    report = outcome.report
    if report is None:
        print(f"pgoverlay: nothing to do for {job.event_name} {ev.action}", file=out)
        outputs.write_outputs(job.output, {"status": "skipped"})
        _say_deployment(outcome, out)
        return 0
    if report.status == "not branched":
        return _not_branched(job, report, out, fork=bool(fork_refusal(ev, inputs)))
    values = _outputs(engine, settings, outcome, out, app_rootcert=app_rootcert)
    values.update(_report_file(job, report))
    outputs.write_outputs(job.output, values)
    summary = comment.render_summary(report)
    if outcome.comment_error:
        outputs.annotation("warning", outcome.comment_error, out, title="PR comment not written")
        why = md.prose(outcome.comment_error, 1000, cell=False)
        summary += f"\n\n> **The PR comment could not be written:** {why}\n"
    if outcome.deployment_error:
        _say_deployment(outcome, out)
        why = md.prose(outcome.deployment_error, 1000, cell=False)
        summary += f"\n\n> **The GitHub Deployment was not written:** {why}\n"
    outputs.write_summary(job.summary, summary)
    for m in report.migrations:
        if m.status == "failed":
            outputs.annotation(
                "error",
                m.error or "migration failed",
                out,
                file=m.file,
                line=m.line,
                title=f"Migration {m.name} failed",
            )
    if report.status == "failed":
        outputs.annotation("error", report.message, out, title="Branch not ready")
    end = conclude(
        report,
        fail_on_threshold=inputs.fail_on_threshold,
        fail_on_migration_error=inputs.fail_on_migration_error,
    )
    # A run its branch or its migrations failed is not judged on thresholds too.
    for m in end.over if end.cause in ("", "threshold") else []:
        assert m.insight is not None
        outputs.annotation(
            "error" if inputs.fail_on_threshold else "warning",
            f"{m.name}: {m.insight.verdict.text}",
            out,
            file=m.file,
            title=f"Migration {m.name} is over a threshold",
        )
    return 0 if end.passed else 1


def _say_deployment(outcome: Outcome, out: TextIO) -> None:
    """One warning when the Deployment could not be written: the step goes on without it."""
    if outcome.deployment_error:
        outputs.annotation(
            "warning", outcome.deployment_error, out, title="GitHub Deployment not written"
        )


def _report_file(job: JobEnv, report: Report) -> dict[str, str]:
    """Write the report as JSON in RUNNER_TEMP; the output naming it (none when the runner names
    no such folder)."""
    if job.temp is None:
        return {}
    path = outputs.write_new(
        job.temp,
        jsonreport.dumps(report),
        prefix="pgoverlay-report-",
        suffix=".json",
        variable="RUNNER_TEMP",
    )
    return {"report-path": str(path)}


def _say_failed(environ: Mapping[str, str]) -> None:
    """Set the ``status`` output to ``failed`` for a step that could not do its work, so a
    later step can tell; as this user, and not at all when GITHUB_OUTPUT is what failed."""
    path = environ.get("GITHUB_OUTPUT")
    if path:
        with contextlib.suppress(PgoverlayError, OSError):
            outputs.write_outputs(Path(path), {"status": "failed"})


def main_from_env(*, destroy: bool = False) -> int:
    try:
        return run(destroy=destroy)
    except PgoverlayError as err:
        outputs.annotation("error", str(err), sys.stdout, title="pgoverlay")
        _say_failed(os.environ)
        return err.exit_code
    except Exception:  # the edge: the traceback is printed, and the status still set
        _say_failed(os.environ)
        raise


def entry(argv: Sequence[str] | None = None) -> int:
    """`pgoverlay-action run|destroy` (what action/run.sh runs): `pgoverlay action run|destroy`
    without the command line's parser, and so without the modules every other command needs
    (rich among them), in a step that users wait for."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in (["run"], ["destroy"]):
        print("usage: pgoverlay-action run|destroy", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return main_from_env(destroy=args[0] == "destroy")


def program() -> None:
    """The `pgoverlay-action` program: ``entry``, then the process ends without the
    interpreter's teardown (freeing every module the step imported, psycopg's among them: tens
    of milliseconds of a step users wait for, and nothing that needs doing). The outputs and
    the summary are written and closed by then; logging is flushed here."""
    code = entry()
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
