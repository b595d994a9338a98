"""Production's statements before and after a migration (action/insight/queries.py): a truth
table on real Postgres. "Before" and "after" are two copies of one database (CREATE DATABASE
... TEMPLATE, for speed), the migration applied to "after" alone, both read as a role that owns
nothing; and once, as the product runs it, two branches of the session's base."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from helpers import as_branch_role, branch_of, extra_server
from pgoverlay.action.insight import paramvalues, queries
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster

pytestmark = pytest.mark.slow

OWNER, APP, TEMPLATE = "qcheck_owner", "qcheck_app", "qcheck_base"

SCHEMA = [
    f"CREATE ROLE {OWNER}",
    f"CREATE ROLE {APP} LOGIN",
]
DATA = [
    "CREATE TABLE customers (id int PRIMARY KEY, email text NOT NULL, name text, region int)",
    "INSERT INTO customers SELECT g, 'User' || g || '@Example.com', 'name ' || g, g % 50 "
    "FROM generate_series(1, 100000) g",
    "CREATE INDEX customers_email_lower ON customers (lower(email))",
    "CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL, "
    "total numeric NOT NULL, ref numeric NOT NULL, code text NOT NULL, created date, note text)",
    "INSERT INTO orders SELECT g, 1 + g % 100000, CASE WHEN g % 10 = 0 THEN 'open' ELSE 'done' "
    "END, g % 9973, g * 7, 'K' || g, date '2026-01-01' + g % 300, 'n' FROM "
    "generate_series(1, 300000) g",
    "CREATE INDEX orders_customer ON orders (customer_id)",
    "CREATE INDEX orders_ref ON orders (ref)",
    "CREATE INDEX orders_code ON orders (code)",
    "CREATE TABLE events (id int PRIMARY KEY, account int NOT NULL, kind text NOT NULL)",
    "INSERT INTO events SELECT g, g % 20000, CASE WHEN g % 100 = 0 THEN 'open' ELSE 'done' "
    "END FROM generate_series(1, 200000) g",
    "CREATE INDEX events_account ON events (account)",
    "CREATE TABLE notes (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id int NOT NULL, "
    "body text NOT NULL)",
    "INSERT INTO notes (order_id, body) SELECT g, 'note ' || g FROM generate_series(1, 1000) g",
    'CREATE SCHEMA billing CREATE TABLE "Invoices" (id int PRIMARY KEY, "Total" numeric)',
    'INSERT INTO billing."Invoices" SELECT g, g % 97 FROM generate_series(1, 1000) g',
    "CREATE VIEW open_orders AS SELECT id, customer_id, status FROM orders WHERE status = 'open'",
    f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP}",
    f"GRANT USAGE ON SCHEMA billing TO {APP}",
    f"GRANT SELECT ON ALL TABLES IN SCHEMA billing TO {APP}",
]


@dataclass(frozen=True)
class Captured:
    queryid: int
    query: str
    calls: int = 100
    per_second: float = 4.0
    mean_ms: float = 1.0


@dataclass(frozen=True)
class Case:
    name: str
    query: str
    migration: str
    verdict: queries.Verdict
    sqlstate: str | None = None  # for a break: the SQLSTATE the after side met
    hidden: bool = False  # what slows it is not in any plan (a trigger, a foreign key's action)


BY_CUSTOMER = "SELECT id, total FROM orders WHERE customer_id = $1"
CASES = [
    Case("dropped index", BY_CUSTOMER, "DROP INDEX orders_customer", "regression"),
    Case(
        "type change makes the index unusable",
        "SELECT id FROM orders WHERE ref = $1::numeric",
        "ALTER TABLE orders ALTER COLUMN ref TYPE bigint",
        "regression",
    ),
    Case(
        "renamed column",
        "SELECT status FROM orders WHERE id = $1",
        "ALTER TABLE orders RENAME COLUMN status TO state",
        "break",
        "42703",
    ),
    Case(
        "dropped column",
        "SELECT name FROM customers WHERE id = $1",
        "ALTER TABLE customers DROP COLUMN name",
        "break",
        "42703",
    ),
    Case(
        "dropped table",
        "SELECT kind FROM events WHERE id = $1",
        "DROP TABLE events",
        "break",
        "42P01",
    ),  # fmt: skip
    Case(
        "ambiguous column",
        "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id WHERE region = $1 "
        "AND o.id < $2",
        "ALTER TABLE orders ADD COLUMN region int",
        "break",
        "42702",
    ),
    Case(
        "privilege revoked",
        "SELECT email FROM customers WHERE id = $1",
        f"REVOKE SELECT ON customers FROM {APP}",
        "break",
        "42501",
    ),
    Case(
        "write of a retyped column",
        "UPDATE orders SET created = $1::date WHERE id = $2",
        "ALTER TABLE orders ALTER COLUMN created TYPE int USING 0",
        "break",
        "42804",
    ),
    Case(
        "value no longer fits the type",
        "SELECT id FROM orders WHERE code = $1",
        "ALTER TABLE orders ALTER COLUMN code TYPE int USING substr(code, 2)::int",
        "break",
        "22P02",
    ),
    Case(
        "new index",
        "SELECT id FROM orders WHERE total = $1",
        "CREATE INDEX orders_total ON orders (total)",
        "improvement",
    ),
    Case(
        "index made partial",
        "SELECT id FROM events WHERE account = $1 AND kind = $2",
        "DROP INDEX events_account; "
        "CREATE INDEX events_account_open ON events (account) WHERE kind = 'open'",
        "regression",
    ),
    Case(
        "expression index replaced by a plain one",
        "SELECT id FROM customers WHERE lower(email) = $1",
        "DROP INDEX customers_email_lower; CREATE INDEX customers_email ON customers (email)",
        "regression",
    ),
    Case(
        "view loses a column",
        "SELECT id, status FROM open_orders WHERE customer_id = $1",
        "DROP VIEW open_orders; CREATE VIEW open_orders AS "
        "SELECT id, customer_id FROM orders WHERE status = 'open'",
        "break",
        "42703",
    ),
    Case(
        "view reads another way",
        "SELECT id FROM open_orders WHERE customer_id = $1",
        "CREATE OR REPLACE VIEW open_orders AS SELECT id, customer_id, status FROM orders "
        "WHERE status = 'open' AND note IS NOT NULL ORDER BY id",
        "plan",
    ),
    Case(
        "new trigger on a write",
        "UPDATE orders SET total = $1 WHERE id = $2",
        "CREATE FUNCTION orders_audit() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN "
        "PERFORM 1 FROM customers WHERE name = NEW.status; RETURN NEW; END $f$; "
        "CREATE TRIGGER orders_audit BEFORE UPDATE ON orders FOR EACH ROW "
        "EXECUTE FUNCTION orders_audit()",
        "regression",
        hidden=True,
    ),
    Case(
        "new NOT NULL column without a default",
        "INSERT INTO notes (order_id, body) VALUES ($1, $2)",
        "ALTER TABLE notes ADD COLUMN author text NOT NULL DEFAULT 'a'; "
        "ALTER TABLE notes ALTER COLUMN author DROP DEFAULT",
        "break",
        "23502",
    ),
    Case(
        "insert that failed on a key now fails on a new NOT NULL column",
        "INSERT INTO events (id, account, kind) VALUES ($1, $2, $3)",
        "ALTER TABLE events ADD COLUMN source text NOT NULL DEFAULT 'a'; "
        "ALTER TABLE events ALTER COLUMN source DROP DEFAULT",
        "break",
        "23502",
    ),
    Case(
        "check constraint the app's writes break",
        "UPDATE orders SET total = $1 WHERE id = $2",
        "ALTER TABLE orders ADD CONSTRAINT orders_total_negative CHECK (total < 0) NOT VALID",
        "break",
        "23514",
    ),
    Case(
        "cascading foreign key without an index",
        "DELETE FROM customers WHERE id = $1",
        "DROP INDEX orders_customer; ALTER TABLE orders ADD CONSTRAINT orders_customer_fk "
        "FOREIGN KEY (customer_id) REFERENCES customers (id) ON DELETE CASCADE",
        "regression",
        hidden=True,
    ),
    Case(
        "foreign key added",
        BY_CUSTOMER,
        "ALTER TABLE orders ADD CONSTRAINT orders_customer_fk FOREIGN KEY (customer_id) "
        "REFERENCES customers (id)",
        "unchanged",
    ),
    Case(
        "partial index the generic plan cannot use",
        "SELECT count(*) FROM events WHERE kind = $1",
        "CREATE INDEX events_open ON events (id) WHERE kind = 'open'",
        "unchanged",
    ),
    Case(
        "column widened",
        "SELECT id FROM events WHERE account = $1",
        "ALTER TABLE events ALTER COLUMN account TYPE bigint",
        "unchanged",
    ),
    Case(
        "unread column dropped",
        "SELECT id, total FROM orders WHERE id = $1",
        "ALTER TABLE orders DROP COLUMN note",
        "unchanged",
    ),
    Case(
        "index on another column",
        BY_CUSTOMER,
        "CREATE INDEX orders_created ON orders (created)",
        "unchanged",
    ),
    Case(
        "index rebuilt under the same name",
        BY_CUSTOMER,
        "DROP INDEX orders_customer; CREATE INDEX orders_customer ON orders (customer_id)",
        "unchanged",
    ),
]
# Statements a migration that touches none of what they read must leave unflagged.
UNRELATED = "CREATE TABLE invoices (id int PRIMARY KEY); ALTER TABLE orders ADD COLUMN tag text; "
UNTOUCHED = [
    BY_CUSTOMER,
    "SELECT o.id, c.email FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.id = $1",
    "SELECT count(*) FROM orders WHERE status = $1 AND created >= $2",
    "SELECT id FROM customers WHERE lower(email) = $1",
    "SELECT id FROM orders WHERE ref = ANY($1) ORDER BY id LIMIT $2",
    "UPDATE orders SET total = $1 WHERE id = $2",
    "DELETE FROM events WHERE id = $1",
    "SELECT * FROM open_orders WHERE id IN ($1, $2, $3)",
    "SELECT id FROM events WHERE account BETWEEN $1 AND $2",
    'SELECT i.id FROM billing."Invoices" i WHERE i."Total" = $1',  # quoted, in another schema
]


@pytest.fixture(scope="module")
def server(pool: Pool) -> Iterator[cluster.Running]:
    """A server of its own with a template database of the truth table's data."""
    with extra_server(pool, "qcheck-source") as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute(f"CREATE DATABASE {TEMPLATE} OWNER {OWNER}")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname=TEMPLATE), autocommit=True
        ) as conn:
            conn.execute(f"SET ROLE {OWNER}")
            for statement in DATA:
                conn.execute(statement)
            conn.execute("RESET ROLE")
            conn.execute("VACUUM ANALYZE")
        yield srv


def copy(server: cluster.Running, name: str, migration: str = "") -> None:
    with psycopg.connect(**server.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} OWNER {OWNER} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")
    if migration:
        with psycopg.connect(**server.conninfo(user="postgres", dbname=name)) as conn:
            conn.execute(f"SET ROLE {OWNER}")
            conn.execute(migration)


def as_app(server: cluster.Running, name: str) -> psycopg.Connection[Any]:
    return psycopg.connect(**server.conninfo(user=APP, dbname=name), autocommit=True)


@pytest.fixture(scope="module")
def before(server: cluster.Running) -> Iterator[psycopg.Connection[Any]]:
    copy(server, "qcheck_before")
    with as_app(server, "qcheck_before") as conn:
        yield conn


def run(
    server: cluster.Running, before: psycopg.Connection[Any], name: str, migration: str,
    statements: list[str], **options: Any,
) -> queries.WorkloadCheck:  # fmt: skip
    copy(server, name, migration)
    with as_app(server, name) as after:
        return queries.check(
            [Captured(i + 1, q) for i, q in enumerate(statements)],
            before=before,
            after=after,
            floor_ms=options.pop("floor_ms", 2.0),
            **options,
        )


def test_truth_table_finds_each_known_outcome(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    wrong = []
    for i, case in enumerate(CASES):
        result = run(server, before, f"qcheck_after_{i}", case.migration, [case.query])
        (found,) = result.statements
        state = found.after_error.sqlstate if found.after_error else None
        if found.verdict != case.verdict or (case.sqlstate and state != case.sqlstate):
            wrong.append((case.name, found))
        if case.verdict in ("plan", "regression", "improvement"):
            changed = found.before_shape != found.after_shape
            assert changed != case.hidden, case.name
        if case.verdict == "unchanged":
            assert found.before_shape == found.after_shape is not None, case.name
    assert wrong == []


def test_unrelated_migration_flags_nothing(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    result = run(server, before, "qcheck_after_unrelated", UNRELATED, UNTOUCHED)
    assert [(c.query, c.verdict) for c in result.statements if c.verdict != "unchanged"] == []
    assert all(c.timing is not None for c in result.statements), [
        (c.query, c.note) for c in result.statements
    ]
    assert result.unchecked == ()


def test_a_sampled_value_never_reaches_the_result(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    case = next(c for c in CASES if c.name == "value no longer fits the type")
    result = run(server, before, "qcheck_after_masked", case.migration, [case.query])
    (found,) = result.statements
    assert found.after_error is not None
    assert found.after_error.sqlstate == "22P02"
    # Postgres quotes the value it could not read ("K123"): the message keeps its place only.
    assert found.after_error.message == 'invalid input syntax for type integer: "…"'
    assert '"K' not in repr(result)


def test_a_statement_failing_before_too_is_not_a_break(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    result = run(server, before, "qcheck_after_failing", UNRELATED,
                 ["SELECT missing FROM orders WHERE id = $1"])  # fmt: skip
    (found,) = result.statements
    assert found.verdict == "unchanged"
    assert found.before_error is not None and found.before_error.sqlstate == "42703"


def test_an_insert_failing_the_same_way_on_both_sides_is_not_a_break(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    result = run(server, before, "qcheck_after_dupkey", UNRELATED,
                 ["INSERT INTO events (id, account, kind) VALUES ($1, $2, $3)"])  # fmt: skip
    (found,) = result.statements
    assert found.verdict == "unchanged"
    assert found.before_error is not None and found.before_error.sqlstate == "23505"
    assert found.note == "not timed: it fails with the sampled values before (23505)"


def test_a_parameter_with_no_column_is_not_timed_and_says_so(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    result = run(server, before, "qcheck_after_unmapped", "DROP INDEX orders_customer",
                 ["SELECT $1 + id FROM orders WHERE customer_id = $2"])  # fmt: skip
    (found,) = result.statements
    assert found.timing is None
    assert found.note == "not timed: no column is compared with $1"
    assert found.verdict == "plan"  # the generic plan still shows the lost index


def test_the_budget_names_the_statements_it_did_not_reach(
    server: cluster.Running, before: psycopg.Connection[Any]
) -> None:
    result = run(server, before, "qcheck_after_budget", UNRELATED, UNTOUCHED[:3], budget_s=0)
    assert result.statements == ()
    assert result.unchecked == (1, 2, 3)


def test_parameters_map_to_what_they_are_compared_with() -> None:
    m = paramvalues.map_params(
        "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id "
        "WHERE lower(c.email) = $1 AND o.ref = ANY($2) AND o.id IN ($3, $4) "
        "AND $5 + o.total > 0 LIMIT $6"
    )
    assert {
        n: (t.expression, t.source and t.source.relation, t.array) for n, t in m.targets.items()
    } == {  # fmt: skip
        1: ("lower(c.email)", "customers", False),
        2: ("o.ref", "orders", True),
        3: ("o.id", "orders", False),
        4: ("o.id", "orders", False),
    }
    assert m.constants == {6: "100"}
    assert m.unmapped == (5,)
    update = paramvalues.map_params("UPDATE orders SET total = $1 WHERE id = $2")
    assert {n: t.expression for n, t in update.targets.items()} == {1: "total", 2: "id"}


def test_a_shape_keeps_nodes_and_names_not_costs() -> None:
    plan = {
        "Node Type": "Nested Loop", "Join Type": "Inner", "Total Cost": 12.5, "Plan Rows": 3,
        "Plans": [
            {"Node Type": "Seq Scan", "Relation Name": "orders", "Alias": "o",
             "Parent Relationship": "Outer", "Total Cost": 9.0},
            {"Node Type": "Index Scan", "Index Name": "customers_pkey",
             "Relation Name": "customers", "Parent Relationship": "Inner", "Plan Rows": 1},
        ],
    }  # fmt: skip
    assert queries.shape(plan) == (
        "Nested Loop [Inner]",
        "  Seq Scan on orders",
        "  Index Scan using customers_pkey on customers",
    )


def test_two_branches_of_the_base_as_the_product_runs_it(pool: Pool, base: BaseVersion) -> None:
    """Before is a branch of the base, after a branch with the migration applied by its own
    role; both are read as their branch's role, over TCP with its password."""
    statements = [
        "SELECT id FROM accounts WHERE owner = $1",
        "SELECT balance FROM accounts WHERE id = $1",
        "SELECT owner FROM accounts WHERE id = $1",
    ]
    with (
        branch_of(pool, base, name="qcheck-before", runtime="local") as b,
        branch_of(pool, base, name="qcheck-after", runtime="local") as a,
        as_branch_role(pool, b) as before,
        as_branch_role(pool, a) as after,
    ):
        after.execute("DROP INDEX accounts_owner")
        after.execute("ALTER TABLE accounts RENAME COLUMN balance TO amount")
        result = queries.check(
            [Captured(i + 1, q) for i, q in enumerate(statements)], before=before, after=after
        )
    found = {c.query: c for c in result.statements}
    assert [found[q].verdict for q in statements] == ["regression", "break", "unchanged"]
    lost = found[statements[0]]
    assert lost.before_shape and "using accounts_owner" in " ".join(lost.before_shape)
    assert lost.after_shape and "Seq Scan on accounts" in " ".join(lost.after_shape)
    assert found[statements[1]].after_error == queries.Failure(
        "42703", 'column "balance" does not exist'
    )
