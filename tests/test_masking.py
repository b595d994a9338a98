"""Masked bases: rules parsed and checked, and a seed with rules leaves no original value in any
byte of the base's files, while keys, uniqueness and branch costs stay as they were."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import psycopg
import pytest
from psycopg import sql

from helpers import cli, source_dsn
from pgoverlay.errors import MaskError, PoolFullError
from pgoverlay.runner import branch, seed
from pgoverlay.runner.mask import fakes
from pgoverlay.runner.mask.rules import QualifiedName, parse
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster

RULES = b"""
tables:
  customers:
    email: {fake: email}
    full_name: {fake: name}
    last_name: {fake: last_name}
    phone: {fake: phone}
    notes: {fake: text}
    tax_id: hash
    password_digest: {value: masked}
    born: {truncate_date: year}
  public.orders:
    customer_email: {fake: email}
    shipping_address: null
  sessions: truncate
sql:
  - DELETE FROM audit WHERE detail LIKE 'auditleak%' OR id >= 0
"""
CUSTOMERS = 120
EMAIL = re.compile(r"^[a-z0-9.]+@[a-z0-9.-]+\.[a-z]+$")


# -- rules files: fast, no server ----------------------------------------------------------------


def test_rules_file_parses_every_strategy_and_table_truncation() -> None:
    loaded = parse(RULES, name="rules.yml")
    columns = loaded.rules.columns()
    customers = columns[QualifiedName("public", "customers")]
    assert customers["email"].describe() == "fake: email"
    assert customers["tax_id"].describe() == "hash"
    assert customers["born"].describe() == "truncate_date: year"
    assert columns[QualifiedName("public", "orders")]["shipping_address"].strategy == "null"
    assert loaded.rules.truncated() == [QualifiedName("public", "sessions")]
    assert loaded.rules.sql == ["DELETE FROM audit WHERE detail LIKE 'auditleak%' OR id >= 0"]
    assert loaded.name == "rules.yml" and len(loaded.sha256) == 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"tables: {users: {email: {fake: emial}}}", "table users, column email: fake 'emial'"),
        (b"tables: {users: {email: scramble}}", "table users, column email: unknown strategy"),
        (b"tables: {users: {email: {value: null}}}", "write null instead"),
        (b"tables: {users: truncat}", "table users: a table rule is `truncate`"),
        (b"tables: {users: {born: {truncate_date: week}}}", "truncate_date 'week'"),
        (b"tables: {a.b.c: truncate}", "'a.b.c' is not a table name"),
        (b"tables: {users: truncate, public.users: truncate}", "name the same table"),
        (b"tables: {}", "the rules mask nothing"),
        (b"tabels: {users: truncate}", "unknown key 'tabels'"),
        (b"tables: [", "not valid YAML at line 1"),
        (b"- a list", "must be a mapping"),
    ],
)
def test_bad_rules_files_are_refused_naming_the_file_and_the_entry(
    text: bytes, expected: str
) -> None:
    with pytest.raises(MaskError) as caught:
        parse(text, name="bad.yml")
    assert "masking rules bad.yml" in str(caught.value)
    assert expected in str(caught.value)


def test_the_documented_example_rules_file_parses() -> None:
    """docs/examples/masking-rules.yml, which the docs point to and bench/mask.py uses."""
    example = Path(__file__).resolve().parent.parent / "docs" / "examples" / "masking-rules.yml"
    rules = parse(example.read_bytes(), name=example.name).rules
    orders = rules.columns()[QualifiedName("public", "orders")]
    assert orders["amount"].argument == "round(amount, -1)"
    assert rules.truncated() == [QualifiedName("public", "sessions")] and rules.sql


def test_same_rules_bytes_give_the_same_checksum_and_other_bytes_another() -> None:
    assert parse(RULES, name="a").sha256 == parse(RULES, name="b").sha256
    assert parse(RULES + b"\n# changed\n", name="a").sha256 != parse(RULES, name="a").sha256


@pytest.mark.parametrize("kind", ["email", "first_name", "last_name", "name", "phone", "text"])
def test_each_fake_computes_the_rows_digest_once(kind: str) -> None:
    """The expressions are inline, so each mention of the digest is one more sha256 per row:
    a fake mentions it once (a name picks a "First Last" pair, not a first and a last name)."""
    expression = fakes.fake(kind, sql.Identifier("value")).as_string(None)
    assert expression.count('"pg_catalog"."sha256"(') == 1


def test_fakes_pick_with_the_digests_leading_bytes_on_a_real_server(
    source: cluster.Running,
) -> None:
    """The digest's bytes 1 and 2 (big-endian) choose the word; the values include NULL, '' and
    non-ASCII text."""
    values = [None, "", "Zoë Ñandú 東京", "+1 (555) 010-9999", *(f"v{i}" for i in range(500))]
    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute("SELECT set_config(%s, %s, false)", (fakes.KEY_SETTING, "ab" * 32))
        for kind, words in (
            ("first_name", fakes.FIRST_NAMES),
            ("name", fakes.FULL_NAMES),
        ):
            d = fakes.digest("first" if kind == "first_name" else kind, sql.Identifier("v"))
            rows = conn.execute(
                sql.SQL(
                    "SELECT {}, get_byte({}, 0) * 256 + get_byte({}, 1) FROM unnest({}::text[]) v"
                ).format(fakes.fake(kind, sql.Identifier("v")), d, d, sql.Literal(values))
            ).fetchall()
            expected = [None if n is None else words[n % len(words)] for _, n in rows]
            assert [picked for picked, _ in rows] == expected


def test_steps_run_side_by_side_end_numbered_in_the_order_they_end() -> None:
    """Two tables masked at once: both start as step 1 of what is done, and the ends are told
    1, 2 in the order they happen, so a log's lines count up."""
    import threading

    from pgoverlay.runner import mask

    told: list[mask.Step] = []
    steps = mask._Steps(told.append, 3)
    first_started, second_ended = threading.Event(), threading.Event()

    def slow() -> None:
        with steps.step("mask public.big"):
            first_started.set()
            assert second_ended.wait(10)

    thread = threading.Thread(target=slow)
    thread.start()
    assert first_started.wait(10)
    with steps.step("mask public.small"):
        pass
    second_ended.set()
    thread.join()
    with steps.step("statistics"):
        pass
    ends = [(s.what, s.index, s.total) for s in told if s.seconds is not None]
    assert ends == [("mask public.small", 1, 3), ("mask public.big", 2, 3), ("statistics", 3, 3)]
    assert [(s.what, s.index) for s in told if s.seconds is None] == [
        ("mask public.big", 1),
        ("mask public.small", 1),
        ("statistics", 3),
    ]


def test_a_free_sql_label_keeps_its_text_and_says_where_it_is_cut() -> None:
    from pgoverlay.runner import mask

    assert mask.sql_label("DELETE FROM audit_log\n  WHERE detail LIKE '%@%'") == (
        "sql: DELETE FROM audit_log WHERE detail LIKE '%@%'"
    )
    long = "UPDATE accounts SET note = NULL WHERE note LIKE '%secret%' AND created < now()"
    label = mask.sql_label(long)
    assert label.endswith("…") and len(label) <= len("sql: ") + mask.LABEL_CHARS
    assert long.startswith(label.removeprefix("sql: ").removesuffix("…"))


def test_tables_split_in_two_lanes_keeping_linked_tables_together(
    source: cluster.Running,
) -> None:
    """The largest group goes first, the next to the lighter lane; a partitioned table with a
    partition named on its own, and two tables a foreign key links, stay in one lane."""
    from pgoverlay.runner import mask
    from pgoverlay.runner.mask.schema import catalog

    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS lanes")
        admin.execute("CREATE DATABASE lanes")
    try:
        with psycopg.connect(
            **source.conninfo(user="postgres", dbname="lanes"), autocommit=True
        ) as conn:
            for statement in (
                "CREATE TABLE big (id int PRIMARY KEY, v text)",
                "INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g",
                "CREATE TABLE parent (id int, v text) PARTITION BY RANGE (id)",
                "CREATE TABLE part PARTITION OF parent FOR VALUES FROM (0) TO (100000)",
                "INSERT INTO parent SELECT g, repeat('x', 100) FROM generate_series(1, 8000) g",
                "CREATE TABLE one (id int PRIMARY KEY, v text)",
                "CREATE TABLE other (id int PRIMARY KEY, one_id int REFERENCES one, v text)",
                "INSERT INTO one SELECT g, 'v' FROM generate_series(1, 9000) g",
                "INSERT INTO other SELECT g, g, 'v' FROM generate_series(1, 9000) g",
            ):
                conn.execute(statement.encode())
            names = [QualifiedName("public", n) for n in ("big", "parent", "part", "one", "other")]
            found = catalog(conn, names)
            sizes = mask._sizes(conn, [t.oid for t in found.values()])
            lanes = mask._lanes(conn, found, sizes)
        big, parent, part, one, other = names
        assert lanes[0] == [big]
        assert sorted(map(str, lanes[1])) == sorted(map(str, [parent, part, one, other]))
        alone = {n: found[n] for n in (big, parent, part)}
        with psycopg.connect(**source.conninfo(user="postgres", dbname="lanes")) as conn:
            assert mask._lanes(conn, alone, sizes) == [[big], [parent, part]]
    finally:
        with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS lanes")


def test_two_lanes_share_the_key_and_a_failure_in_either_fails_the_masking(
    source: cluster.Running, tmp_path: Path
) -> None:
    """Two tables masked side by side, on two connections: the same email gives the same fake in
    both; a rule that fails on either connection fails the masking, naming its table. The phone
    fake keeps every character but the ASCII digits, in non-ASCII values too, and NULL."""
    from pgoverlay.runner import mask

    def connect() -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(**source.conninfo(user="postgres", dbname="lanes2"), autocommit=True)

    opened: list[int] = []

    def lane() -> psycopg.Connection[tuple[object, ...]]:
        opened.append(1)
        return connect()

    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS lanes2")
        admin.execute("CREATE DATABASE lanes2")
    try:
        with connect() as conn:
            for statement in (
                "CREATE TABLE a (id int PRIMARY KEY, email text, phone text, pad text)",
                "INSERT INTO a SELECT g, 'user' || g || '@corp.example', "
                "CASE g % 3 WHEN 0 THEN NULL WHEN 1 THEN '+1 (555) 010-' || g "
                "ELSE '☎ Zoë ' || g || ' ext. 7' END, repeat('x', 300) "
                "FROM generate_series(1, 3000) g",
                "CREATE TABLE b (id int PRIMARY KEY, email text, n int)",
                "INSERT INTO b SELECT g, 'user' || g || '@corp.example', g "
                "FROM generate_series(1, 500) g",
            ):
                conn.execute(statement.encode())
            rules = parse(
                b"tables:\n  a: {email: {fake: email}, phone: {fake: phone}}\n"
                b"  b: {email: {fake: email}}\n",
                name="r",
            ).rules
            masked = mask.apply(
                conn, rules, rules_name="r", statement_timeout=60, lane=lane, datadir=tmp_path
            )
            assert opened == [1] and masked.tables_in_one_pass == 2
            rows = conn.execute(
                "SELECT count(*) FILTER (WHERE a.email = b.email), "
                "count(*) FILTER (WHERE a.email LIKE 'user%%' OR b.email LIKE 'user%%') "
                "FROM a JOIN b USING (id)"
            ).fetchone()
            assert rows == (500, 0)
            phones = conn.execute("SELECT id, phone FROM a ORDER BY id").fetchall()
            unchanged = 0
            for i, phone in cast("list[tuple[int, str | None]]", phones):
                if i % 3 == 0:
                    assert phone is None
                    continue
                original = f"+1 (555) 010-{i}" if i % 3 == 1 else f"☎ Zoë {i} ext. 7"
                assert phone is not None
                unchanged += phone == original  # two or three digits may come out the same
                for got, was in zip(phone, original, strict=True):
                    assert got.isascii() and got.isdigit() if was in "0123456789" else got == was
            assert unchanged < 20
            failing = parse(
                b"tables:\n  a: {email: {fake: email}}\n  b: {n: {sql: '1 / (n - n)'}}\n",
                name="r",
            ).rules
        with connect() as conn, pytest.raises(MaskError, match=r"mask public\.b.*division by"):
            mask.apply(
                conn, failing, rules_name="r", statement_timeout=60, lane=lane, datadir=tmp_path
            )
        assert opened == [1, 1]
        # The first connection's table fails: the second's statement is cancelled, not waited
        # for (500 rows of 20 ms each would take 10 s).
        failing = parse(
            b"tables:\n  a: {pad: {sql: '1 / (id - id)'}}\n"
            b"  b: {n: {sql: 'n + length(pg_sleep(0.02)::text)'}}\n",
            name="r",
        ).rules
        started = time.monotonic()
        with connect() as conn, pytest.raises(MaskError, match=r"mask public\.a.*division by"):
            mask.apply(
                conn, failing, rules_name="r", statement_timeout=60, lane=lane, datadir=tmp_path
            )
        assert opened == [1, 1, 1] and time.monotonic() - started < 9
    finally:
        with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS lanes2 WITH (FORCE)")


# -- a real source with personal data ------------------------------------------------------------


@dataclass(frozen=True)
class Originals:
    emails: list[str]
    names: list[str]
    last_names: list[str]
    phones: list[str]
    notes: list[str]
    tax_ids: list[str]
    digests: list[str]
    addresses: list[str]
    session_tokens: list[str]
    audit: list[str]

    def needles(self) -> dict[str, list[bytes]]:
        """Every original as the bytes to look for. A TOASTed note is cut into ~2 kB chunks,
        so three 64-byte pieces of it are looked for, each inside one chunk."""
        pieces = [p for n in self.notes for p in (n[:64], n[2100:2164], n[-64:])]
        return {
            kind: [v.encode() for v in values]
            for kind, values in {
                "email": self.emails,
                "name": self.names,
                "last name": self.last_names,
                "phone": self.phones,
                "note": pieces,
                "tax id": self.tax_ids,
                "digest": self.digests,
                "address": self.addresses,
                "session": self.session_tokens,
                "audit": self.audit,
            }.items()
        }


def _originals() -> Originals:
    rnd = random.Random(7)

    def token() -> str:
        return f"{rnd.getrandbits(40):010x}"

    def note() -> str:  # random hex: with STORAGE EXTERNAL it is stored as is, out of line
        return "".join(f"{rnd.getrandbits(128):032x}" for _ in range(140))  # 4480 characters

    surnames = [f"Famname{k:02d}{token()}" for k in range(12)]
    return Originals(
        emails=[f"leak{i:04d}.{token()}@realmail.test" for i in range(CUSTOMERS)],
        names=[f"Realname{token()} Person{i}" for i in range(CUSTOMERS)],
        last_names=[surnames[i % len(surnames)] for i in range(CUSTOMERS)],
        phones=[
            f"+44 20 {rnd.randrange(10**4):04d} {rnd.randrange(10**4):04d}"
            for _ in range(CUSTOMERS)
        ],
        notes=[note() for _ in range(CUSTOMERS)],
        tax_ids=[f"TAX-{token()}" for _ in range(CUSTOMERS)],
        digests=[f"pwdig{token()}" for _ in range(CUSTOMERS)],
        addresses=[f"{i} Secretstreet {token()}" for i in range(CUSTOMERS)],
        session_tokens=[f"sess{token()}" for _ in range(CUSTOMERS // 2)],
        audit=[f"auditleak{token()}" for _ in range(CUSTOMERS // 2)],
    )


@pytest.fixture(scope="module")
def people(source: cluster.Running) -> Iterator[Originals]:
    """Database `people` on the source: personal data in several shapes, analysed."""
    data = _originals()
    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE people OWNER app_owner")
    with psycopg.connect(**source.conninfo(user="postgres", dbname="people")) as conn:
        conn.execute("SET ROLE app_owner")
        conn.execute(
            "CREATE TABLE customers (id int PRIMARY KEY, email text NOT NULL UNIQUE, "
            "full_name text NOT NULL, last_name text NOT NULL, phone text, notes text, "
            "tax_id text, password_digest text, born date)"
        )
        conn.execute("ALTER TABLE customers ALTER notes SET STORAGE EXTERNAL")
        conn.execute("CREATE INDEX customers_lower_email ON customers (lower(email))")
        conn.execute("CREATE STATISTICS customers_names (mcv) ON last_name, born FROM customers")
        conn.execute(
            "CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, "
            "customer_email text NOT NULL REFERENCES customers (email), shipping_address text)"
        )
        conn.execute("CREATE TABLE sessions (id int PRIMARY KEY, token text NOT NULL)")
        conn.execute("CREATE TABLE audit (id int PRIMARY KEY, detail text NOT NULL)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s, %s, %s, "
                "date '1970-01-01' + %s)",
                [
                    (i, data.emails[i], data.names[i], data.last_names[i], data.phones[i])
                    + (data.notes[i], data.tax_ids[i], data.digests[i], 137 * i)
                    for i in range(CUSTOMERS)
                ],
            )
            # Two orders per customer, keyed by the customer's email.
            cur.executemany(
                "INSERT INTO orders VALUES (%s, %s, %s, %s)",
                [
                    (2 * i + k, i, data.emails[i], data.addresses[i])
                    for i in range(CUSTOMERS)
                    for k in range(2)
                ],
            )
            cur.executemany(
                "INSERT INTO sessions VALUES (%s, %s)", list(enumerate(data.session_tokens))
            )
            cur.executemany("INSERT INTO audit VALUES (%s, %s)", list(enumerate(data.audit)))
        conn.execute(
            "CREATE MATERIALIZED VIEW customer_contacts AS SELECT id, email, phone FROM customers"
        )
        conn.execute("RESET ROLE")
        conn.commit()
    with psycopg.connect(**source.conninfo(user="postgres", dbname="people")) as conn:
        conn.execute("ANALYZE")
        conn.commit()
        conn.execute("CHECKPOINT")
    yield data


def _files_contents(root: Path) -> bytes:
    chunks = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                chunks.append(path.read_bytes())
    return b"\0".join(chunks)


def _found(contents: bytes, needles: dict[str, list[bytes]]) -> dict[str, list[bytes]]:
    return {
        kind: hits
        for kind, values in needles.items()
        if (hits := [v for v in values if v in contents])
    }


@pytest.fixture(scope="module")
def plain(pool: Pool, source: cluster.Running, people: Originals) -> Iterator[BaseVersion]:
    base = seed.seed(pool, "people-plain", source_dsn=source_dsn(source, dbname="people"))
    yield base
    seed.remove_version(pool, base.name, base.version)


@pytest.fixture(scope="module")
def masked_seed(
    pool: Pool,
    source: cluster.Running,
    people: Originals,
    env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[BaseVersion, str]]:
    """The masked base, seeded by the command as a script runs it (no terminal), and what the
    command wrote on stderr."""
    rules = tmp_path_factory.mktemp("rules") / "people-rules.yml"
    rules.write_bytes(RULES)
    dsn = source_dsn(source, dbname="people")
    try:
        done = cli(
            ["base", "seed", "people-masked", "--from", dsn, "--mask", os.fspath(rules)],
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert "masked by people-rules.yml (sha256" in " ".join(done.stdout.split())
        base = pool.registry.latest_base("people-masked")
        assert base is not None
        yield base, done.stderr
    finally:
        for version in pool.registry.bases("people-masked"):
            seed.remove_version(pool, version.name, version.version)


@pytest.fixture(scope="module")
def masked(masked_seed: tuple[BaseVersion, str]) -> BaseVersion:
    return masked_seed[0]


def test_search_finds_the_originals_in_an_unmasked_base_including_toast_and_statistics(
    pool: Pool, plain: BaseVersion, people: Originals
) -> None:
    """The control for the next test: the same search does find what an unmasked base holds."""
    contents = _files_contents(pool.store_dir(plain.name, plain.version))
    found = _found(contents, {k: v[:5] for k, v in people.needles().items()})
    # Sessions and audit rows are live in the source; all of them are in the unmasked copy.
    assert set(found) == set(people.needles()), f"not found: {set(people.needles()) - set(found)}"
    b = branch.create(pool, "people-plain-br", base_name=plain.name)
    try:
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            row = conn.execute(
                "SELECT most_common_vals::text FROM pg_stats "
                "WHERE tablename = 'customers' AND attname = 'last_name'"
            ).fetchone()
            toast = conn.execute(
                "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'customers'"
            ).fetchone()
        assert row is not None and people.last_names[0] in str(row[0])
        assert toast is not None and toast[0] > CUSTOMERS * 4000
    finally:
        branch.destroy(pool, "people-plain-br")


def test_no_original_value_is_left_in_any_byte_of_a_masked_base(
    pool: Pool, masked: BaseVersion, people: Originals
) -> None:
    contents = _files_contents(pool.store_dir(masked.name, masked.version))
    assert len(contents) > 1024 * 1024
    found = _found(contents, people.needles())
    assert found == {}, {kind: [h.decode() for h in hits[:3]] for kind, hits in found.items()}


def test_masked_values_keep_keys_uniqueness_and_format(
    pool: Pool, masked: BaseVersion, people: Originals
) -> None:
    b = branch.create(pool, "people-masked-br", base_name=masked.name)
    try:
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            rows = conn.execute(
                "SELECT id, email, full_name, last_name, phone, length(notes), tax_id, "
                "password_digest, born FROM customers ORDER BY id"
            ).fetchall()
            mismatched = conn.execute(
                "SELECT count(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
                "WHERE o.customer_email <> c.email"
            ).fetchone()
            orphans = conn.execute(
                "SELECT count(*) FROM orders o LEFT JOIN customers c "
                "ON c.email = o.customer_email WHERE c.id IS NULL"
            ).fetchone()
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM orders), "
                "(SELECT count(*) FROM orders WHERE shipping_address IS NOT NULL), "
                "(SELECT count(*) FROM sessions), (SELECT count(*) FROM audit), "
                "(SELECT count(*) FROM customer_contacts c JOIN customers USING (id, email))"
            ).fetchone()
            databases = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
            stats = conn.execute(
                "SELECT most_common_vals::text FROM pg_stats "
                "WHERE tablename = 'customers' AND attname = 'last_name'"
            ).fetchone()
        emails = [r[1] for r in rows]
        assert len(rows) == CUSTOMERS
        assert len(set(emails)) == CUSTOMERS and all(EMAIL.match(e) for e in emails)
        assert not set(emails) & set(people.emails)
        assert mismatched == (0,) and orphans == (0,)  # the same email maps the same everywhere
        assert counts == (2 * CUSTOMERS, 0, 0, 0, CUSTOMERS)
        for (i, _, name, last, phone, notes_length, tax, digest, born), original in zip(
            rows, people.phones, strict=True
        ):
            assert re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", name)
            assert last.isalpha() and last not in people.last_names
            assert re.fullmatch(r"\+\d\d \d\d \d{4} \d{4}", phone) and phone != original
            assert notes_length == len(people.notes[i])
            assert re.fullmatch(r"[0-9a-f]{64}", tax) and digest == "masked"
            assert (born.month, born.day) == (1, 1)
        # Statistics were recomputed from the masked data, not dropped.
        assert stats is not None and stats[0] is not None
        assert not any(name in str(stats[0]) for name in people.last_names)
        assert "app" not in databases and "people" in databases  # only the served database
    finally:
        branch.destroy(pool, "people-masked-br")


def test_branch_of_a_masked_base_starts_with_a_layer_as_small_as_an_unmasked_one(
    pool: Pool, plain: BaseVersion, masked: BaseVersion
) -> None:
    sizes = {}
    for base in (plain, masked):
        name = f"{base.name}-size"
        branch.create(pool, name, base_name=base.name)
        try:
            sizes[base.name] = branch.layer_size(pool, name).physical_bytes
        finally:
            branch.destroy(pool, name)
    plain_bytes, masked_bytes = sizes[plain.name], sizes[masked.name]
    assert masked_bytes <= max(2 * plain_bytes, plain_bytes + 1024 * 1024), sizes


def test_seed_list_and_registry_record_the_rules_and_their_checksum(
    pool: Pool, plain: BaseVersion, masked: BaseVersion, env: dict[str, str]
) -> None:
    assert masked.mask_rules == "people-rules.yml"
    assert masked.mask_sha256 == parse(RULES, name="x").sha256
    assert not plain.masked and plain.mask_label == "not masked"
    done = cli(["base", "list", "--json"], env=env)
    assert done.returncode == 0, done.stderr
    listed = {b["name"]: b for b in json.loads(done.stdout)}
    assert listed["people-masked"]["mask_sha256"] == masked.mask_sha256
    assert listed["people-plain"]["mask_sha256"] == ""
    table = cli(["base", "list"], env={**env, "COLUMNS": "400"})
    assert masked.mask_sha256[:12] in table.stdout


def test_refreshing_a_masked_base_without_rules_is_refused(
    pool: Pool, source: cluster.Running, masked: BaseVersion
) -> None:
    with pytest.raises(MaskError, match="--mask RULES.*--no-mask"):
        seed.seed(
            pool,
            masked.name,
            source_dsn=source_dsn(source, dbname="people"),
            refresh=True,
        )
    assert pool.registry.latest_base(masked.name) == masked


def test_rule_for_a_missing_column_fails_the_seed_naming_it_and_leaves_no_version(
    pool: Pool, source: cluster.Running, people: Originals, tmp_path: Path, env: dict[str, str]
) -> None:
    rules = tmp_path / "typo.yml"
    rules.write_text("tables:\n  customers:\n    emial: {fake: email}\n  shipments: truncate\n")
    dsn = source_dsn(source, dbname="people")
    done = cli(["base", "seed", "people-typo", "--from", dsn, "--mask", os.fspath(rules)], env=env)
    assert done.returncode == MaskError.exit_code, done.stderr
    assert "column public.customers.emial does not exist" in done.stderr
    assert "table public.shipments does not exist" in done.stderr
    assert pool.registry.bases("people-typo") == []
    assert not (pool.root / "store" / "people-typo").exists()
    assert not list(pool.root.glob("staging/people-typo*"))


def test_rules_breaking_a_foreign_key_are_refused_before_copying(
    pool: Pool, source: cluster.Running, people: Originals, tmp_path: Path
) -> None:
    rules = tmp_path / "half.yml"
    rules.write_text("tables:\n  customers:\n    email: {fake: email}\n")
    with pytest.raises(MaskError, match=r"public\.orders\.customer_email references"):
        seed.seed(pool, "people-half", source_dsn=source_dsn(source, dbname="people"), mask=rules)
    assert pool.registry.bases("people-half") == []


def test_a_masked_seed_without_a_terminal_prints_a_line_per_table_as_it_goes(
    masked_seed: tuple[BaseVersion, str],
) -> None:
    """Progress for a log or a CI job: a line per finished step, saying how each table was
    masked. A materialized view reads customers.email, so customers is updated and rewritten;
    orders is rewritten in one pass, its foreign key to customers set aside meanwhile."""
    lines = [line for line in masked_seed[1].splitlines() if line.startswith("masking [")]
    said = "\n".join(lines)
    assert re.search(r"^masking \[\d+/\d+\] truncate 1 table\(s\): [0-9.]+ s$", said, re.M)
    assert re.search(
        r"mask public\.customers: updated \(rewritten below\), .*B, [0-9.]+ s$", said, re.M
    )
    assert re.search(r"mask public\.orders: rewritten in one pass, .*B, [0-9.]+ s$", said, re.M)
    assert re.search(r"restore 1 foreign key\(s\): [0-9.]+ s$", said, re.M)
    # The free SQL's label is the whole statement, '%' and all, where it fits on a line.
    assert re.search(
        r"sql: DELETE FROM audit WHERE detail LIKE 'auditleak%' OR id >= 0: [0-9.]+ s$", said, re.M
    )
    assert re.search(
        r"refresh 1 view\(s\), rewrite \d+ table\(s\), statistics: .*"
        r"rewrote \"public\"\.\"customers\" \(.*B, [0-9.]+ s\).*, [0-9.]+ s$",
        said,
        re.M,
    )
    numbers = [tuple(map(int, re.findall(r"\[(\d+)/(\d+)\]", line)[0])) for line in lines]
    assert [i for i, _ in numbers] == list(range(1, len(lines) + 1))
    # The count is known before the first step and never moves: [k/6] on every line.
    assert {total for _, total in numbers} == {len(lines)} == {6}


def test_the_space_estimate_adds_the_peak_of_the_costliest_masked_table() -> None:
    """A table rewritten in one pass has its new files beside the old ones: once its size. One a
    view reads is updated, then rewritten: twice, and the WAL of the update (the masking
    server's max_wal_size). So is a table the free SQL names."""
    from pgoverlay.runner.seed import space

    rules = parse(
        b"tables:\n  big: {email: {fake: email}}\n  viewed: {email: {fake: email}}\n"
        b"sql:\n  - DELETE FROM Audit WHERE note IS NULL\n",
        name="r",
    ).rules
    big, viewed, audit = (QualifiedName("public", n) for n in ("big", "viewed", "audit"))
    mib, wal = 1 << 20, 128 << 20
    sizes = space.Sizes(
        cluster_bytes=1000 * mib,
        database_bytes=900 * mib,
        masked=[space.Table(big, 300 * mib, False), space.Table(viewed, 100 * mib, False)],
        tables={big: 300 * mib, viewed: 100 * mib, audit: 50 * mib},
    )
    assert space.estimate(sizes, None).total == 1150 * mib + space.MARGIN
    assert space.estimate(sizes, None, dump=True).copy_bytes == 900 * mib
    one_pass = space.estimate(sizes, rules)
    assert one_pass.masking_bytes == 300 * mib and one_pass.peak_table.startswith("public.big,")
    sizes.tables[audit] = 120 * mib
    by_sql = space.estimate(sizes, rules)
    assert by_sql.masking_bytes == 240 * mib + wal and "free SQL" in by_sql.peak_table
    sizes.masked[1] = space.Table(viewed, 200 * mib, True)
    sizes.tables[viewed] = 200 * mib
    viewed_peak = space.estimate(sizes, rules)
    assert viewed_peak.masking_bytes == 400 * mib + wal and "a view" in viewed_peak.peak_table
    with pytest.raises(PoolFullError, match=r"about 1\.70 GiB .*masking 528\.0 MiB at its peak"):
        space.check(viewed_peak, free_bytes=1 << 30, base="b")


def test_a_masked_seed_the_pool_has_no_room_for_fails_before_copying_saying_why(
    pool: Pool, source: cluster.Running, people: Originals, env: dict[str, str], tmp_path: Path
) -> None:
    """Ballast leaves the pool half of what the seed needs: the command fails at once (exit 6),
    says what it needs and for what, and leaves no version and no copy."""
    from pgoverlay.runner.seed import space

    rules = tmp_path / "people-rules.yml"
    rules.write_bytes(RULES)
    dsn = source_dsn(source, dbname="people")
    with psycopg.connect(dsn) as conn:
        sizes = space.measure(conn, parse(RULES, name="r").rules)
    assert sizes is not None and sizes.masked
    need = space.estimate(sizes, parse(RULES, name="r").rules)
    ballast = pool.tmp / "ballast"
    try:
        with ballast.open("wb") as f:
            os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(pool.root).free - need.total // 2)
        staged = set(pool.root.joinpath("staging").rglob("*"))
        done = cli(
            ["base", "seed", "people-roomless", "--from", dsn, "--mask", os.fspath(rules)], env=env
        )
    finally:
        ballast.unlink(missing_ok=True)
    assert done.returncode == 6, done.stderr
    said = " ".join(done.stderr.split())
    assert "seeding base people-roomless needs about" in said
    assert "masking" in said and "at its peak (public.customers" in said
    assert "nothing was copied" in said
    assert pool.registry.bases("people-roomless") == []
    assert set(pool.root.joinpath("staging").rglob("*")) == staged
