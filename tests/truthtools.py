"""Alembic and Django projects whose migrations are the truth table's statements, one per
migration, so that each run of the tool's migrate command applies exactly one of them.

Each project starts with an empty migration (applied before anything is measured: it makes the
tool's ledger table, ``alembic_version`` or ``django_migrations``); the statements follow, in
the table's order. A statement that cannot run in a transaction runs as each tool documents
it: in Alembic's ``autocommit_block``, in a Django migration with ``atomic = False``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from truthtable import Statement

_ALEMBIC_ENV = '''"""The branch comes in DATABASE_URL, as migrate-command mode passes it."""

import os

from alembic import context
from sqlalchemy import create_engine, pool

url = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
'''

_ALEMBIC_REVISION = """from alembic import op

revision = {revision!r}
down_revision = {down!r}


def upgrade() -> None:
{body}
"""

_DJANGO_MANAGE = """import os
import sys

from django.core.management import execute_from_command_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "truthsite.settings")
execute_from_command_line(sys.argv)
"""

# The branch's login comes in libpq's own variables (PGHOST, PGUSER, PGPASSWORD...), which the
# backend's libpq reads for every setting left empty here.
_DJANGO_SETTINGS = """import os

SECRET_KEY = "truth-table"
INSTALLED_APPS = ["shop"]
USE_TZ = True
DATABASES = {
    "default": {"ENGINE": "django.db.backends.postgresql", "NAME": os.environ["PGDATABASE"]}
}
"""

_DJANGO_MIGRATION = """from django.db import migrations


class Migration(migrations.Migration):
    atomic = {atomic}
    dependencies = {dependencies!r}
    operations = {operations}
"""


def alembic_project(folder: Path, statements: Sequence[Statement], schema: str) -> list[str]:
    """Write the project; the command that applies the next migration, once per statement."""
    (folder / "versions").mkdir(parents=True)
    (folder / "alembic.ini").write_text("[alembic]\nscript_location = %(here)s\n")
    (folder / "env.py").write_text(_ALEMBIC_ENV)
    down = None
    for number, statement in enumerate([None, *statements]):
        revision = f"r{number:02d}"
        if statement is None:
            body = "    pass"
        elif statement.in_transaction:
            body = f"    op.execute({statement.text(schema)!r})"
        else:
            body = (
                "    with op.get_context().autocommit_block():\n"
                f"        op.execute({statement.text(schema)!r})"
            )
        text = _ALEMBIC_REVISION.format(revision=revision, down=down, body=body)
        (folder / "versions" / f"{revision}.py").write_text(text)
        down = revision
    command = f"{sys.executable} -m alembic -c alembic.ini upgrade +1"
    return [command] * (len(statements) + 1)


def django_project(folder: Path, statements: Sequence[Statement], schema: str) -> list[str]:
    """Write the project; the command that applies each migration in turn, the empty first
    one included."""
    (folder / "truthsite").mkdir(parents=True)
    (folder / "truthsite" / "__init__.py").write_text("")
    (folder / "truthsite" / "settings.py").write_text(_DJANGO_SETTINGS)
    (folder / "manage.py").write_text(_DJANGO_MANAGE)
    migrations = folder / "shop" / "migrations"
    migrations.mkdir(parents=True)
    (folder / "shop" / "__init__.py").write_text("")
    (migrations / "__init__.py").write_text("")
    names: list[str] = []
    for number, statement in enumerate([None, *statements], start=1):
        name = f"{number:04d}_{statement.name if statement else 'start'}"
        operations = "[]"
        if statement is not None:
            operations = f"[migrations.RunSQL({statement.text(schema)!r})]"
        dependencies = [("shop", names[-1])] if names else []
        atomic = statement is None or statement.in_transaction
        text = _DJANGO_MIGRATION.format(
            atomic=atomic, dependencies=dependencies, operations=operations
        )
        (migrations / f"{name}.py").write_text(text)
        names.append(name)
    return [f"{sys.executable} manage.py migrate --no-input shop {name}" for name in names]
