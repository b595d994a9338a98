"""The masking strategies as SQL expressions, one per column rule, computed per row by the server.

Built on the built-in ``sha256()``: no extension needed. A row's digest for a strategy ``kind``
is ``sha256(key || kind || 0x00 || value)``; the key is random per seed, so the same input gives
the same output in every table of one seed (joins and foreign keys on masked values still match),
while originals cannot be found by hashing guesses. The kind keeps each strategy's outputs
unrelated. NULL stays NULL under every strategy.

The key reaches the server once, as a bound parameter of ``set_config`` (``KEY_SETTING``, a
setting of the masking session only: never in SQL text, a catalog or a file), and the expressions
read it with ``current_setting``. That lets a table be rewritten by ``ALTER TABLE … USING``,
which takes no bound parameters.

The expressions are plain SQL inline in the statement, not calls of SQL functions: a SQL function
whose body uses a stable built-in (``convert_to``) is not inlined when declared immutable, and a
call then costs more than the digest (measured: 16 µs a row against 2 µs, see
docs/benchmarks.md, "mask"). Only ``fake: phone``, which walks the value's bytes, is a
PL/pgSQL function, created in the session's temporary schema (it vanishes with the session).
"""

from __future__ import annotations

from psycopg import sql

KEY_SETTING = "pgoverlay.mask_key"

FIRST_NAMES = [
    "Ada",
    "Alan",
    "Alice",
    "Amir",
    "Ana",
    "Ben",
    "Carla",
    "Chen",
    "Dana",
    "David",
    "Elena",
    "Emma",
    "Farah",
    "Felix",
    "Grace",
    "Hana",
    "Ivan",
    "Jonas",
    "Julia",
    "Kai",
    "Lara",
    "Leo",
    "Lina",
    "Luca",
    "Maya",
    "Mei",
    "Nina",
    "Noah",
    "Omar",
    "Paula",
    "Priya",
    "Rosa",
    "Sam",
    "Sara",
    "Tomas",
    "Uma",
    "Vera",
    "Yuki",
    "Zoe",
]
LAST_NAMES = [
    "Adams",
    "Bauer",
    "Costa",
    "Dubois",
    "Evans",
    "Fischer",
    "Garcia",
    "Hansen",
    "Ito",
    "Jensen",
    "Kim",
    "Larsen",
    "Lopez",
    "Meyer",
    "Moreau",
    "Nakamura",
    "Novak",
    "Okafor",
    "Olsen",
    "Park",
    "Petrov",
    "Quinn",
    "Rossi",
    "Santos",
    "Schmidt",
    "Silva",
    "Smith",
    "Tanaka",
    "Torres",
    "Varga",
    "Wagner",
    "Weber",
    "Wilson",
    "Yamada",
    "Young",
    "Zhang",
    "Ziegler",
]
# "First Last" for every pair: a name picks one entry, so it reads the row's digest once (two
# picks, one per part, would compute the digest twice).
FULL_NAMES = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco "
    "laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in "
    "voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat "
    "cupidatat non proident, sunt in culpa qui officia deserunt mollit anim id est laborum. "
)
assert LOREM.isascii()  # the text fake cuts it as bytes
assert all(len(n.encode()) < 64 for n in FULL_NAMES)  # each fits a name (63 bytes at most)

# The one function: a loop over the value's UTF-8 bytes, every ASCII digit replaced by one taken
# from the digest's byte at that offset, everything else kept. Bytes 0x30-0x39 are only ever
# ASCII digits in UTF-8 (a multi-byte character's bytes are all 0x80 or above), so the other
# characters come back unchanged whatever the collation. Walking bytes rather than characters
# halves the statements per step (measured: 4.5 µs a value against 7.2, docs/benchmarks.md).
PHONE = sql.Identifier("pg_temp", "pgo_phone_digits")
FUNCTIONS = [
    """CREATE FUNCTION pg_temp.pgo_phone_digits(value text, d bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        b bytea := pg_catalog.convert_to(value, 'UTF8');
    BEGIN
        FOR i IN 0 .. pg_catalog.octet_length(b) - 1 LOOP
            IF pg_catalog.get_byte(b, i) BETWEEN 48 AND 57 THEN
                b := pg_catalog.set_byte(b, i, 48 + pg_catalog.get_byte(d, i % 32) % 10);
            END IF;
        END LOOP;
        RETURN pg_catalog.convert_from(b, 'UTF8');
    END $$""",
]


# The digest's kind per fake, where it is not the fake's own name.
_DIGEST_KIND = {"first_name": "first", "last_name": "last"}


def _call(name: str, *args: sql.Composable) -> sql.Composed:
    """A built-in function, qualified: no schema of the base can stand in for it."""
    return sql.SQL("{}({})").format(sql.Identifier("pg_catalog", name), sql.SQL(", ").join(args))


def key() -> sql.Composed:
    """The seed's key, as the session holds it (hex in ``KEY_SETTING``)."""
    return _call("decode", _call("current_setting", sql.Literal(KEY_SETTING)), sql.Literal("hex"))


def digest(kind: str, value: sql.Composable) -> sql.Composed:
    """``sha256(key || kind || 0x00 || value as UTF-8)``: NULL for a NULL value."""
    prefix = kind.encode() + b"\x00"
    return _call(
        "sha256",
        sql.SQL("{} || {} || {}").format(
            key(), sql.Literal(prefix), _call("convert_to", value, sql.Literal("UTF8"))
        ),
    )


def _bytes16(d: sql.Composable, byte: int) -> sql.Composed:
    """``get_byte(d, byte) * 256 + get_byte(d, byte + 1)`` reading ``d`` once: the digest is
    inline, so every mention of it computes it again. Only the two bytes are hex-encoded."""
    pair = _call("substr", d, sql.Literal(byte + 1), sql.Literal(2))
    return sql.SQL("(('x' || {})::bit(16)::int)").format(_call("encode", pair, sql.Literal("hex")))


def _pick(words: list[str], d: sql.Composable, byte: int) -> sql.Composed:
    """A word of ``words`` chosen by the digest's bytes ``byte`` and ``byte + 1``. The array is
    of ``name``, a fixed-width type, so an element is found by its offset: in a ``text[]``,
    which Postgres walks from the start, picking among the 1,443 full names cost more than the
    digest (measured: 3.4 µs a value against 1.5, docs/benchmarks.md)."""
    array = sql.SQL("(ARRAY[{}]::pg_catalog.name[])").format(
        sql.SQL(", ").join(map(sql.Literal, words))
    )
    return sql.SQL("{}[1 + {} % {}]::text").format(
        array, _bytes16(d, byte), sql.Literal(len(words))
    )


def fake(kind: str, value: sql.Composable) -> sql.Composed:
    """The fake ``kind`` (rules.FAKES) of the text ``value``."""
    d = digest(_DIGEST_KIND.get(kind, kind), value)
    if kind == "email":  # the digest's first 8 bytes in hex
        return sql.SQL("'u' || {} || '@example.com'").format(
            _call("encode", _call("substr", d, sql.Literal(1), sql.Literal(8)), sql.Literal("hex"))
        )
    if kind == "first_name":
        return _pick(FIRST_NAMES, d, 0)
    if kind == "last_name":
        return _pick(LAST_NAMES, d, 0)
    if kind == "name":
        return _pick(FULL_NAMES, d, 0)
    if kind == "phone":
        return sql.SQL("{}({}, {})").format(PHONE, value, d)
    if kind == "text":
        lorem = sql.Literal(LOREM)
        start = sql.SQL("1 + {} % {}").format(_bytes16(d, 0), sql.Literal(len(LOREM)))
        copies = sql.SQL("{} / {} + 2").format(_call("length", value), sql.Literal(len(LOREM)))
        # Cut as bytes (the text is ASCII): a text's substr walks its characters to the start.
        text = _call("convert_to", _call("repeat", lorem, copies), sql.Literal("UTF8"))
        cut = _call("substr", text, start, _call("length", value))
        return _call("convert_from", cut, sql.Literal("UTF8"))
    raise ValueError(f"unknown fake {kind!r}")


def hashed(value: sql.Composable, *, uuid: bool) -> sql.Composed:
    """64 hex digits of the keyed digest, or its first 16 bytes as a uuid."""
    d = digest("hash", value)
    if uuid:
        return sql.SQL("{}::uuid").format(
            _call("encode", _call("substr", d, sql.Literal(1), sql.Literal(16)), sql.Literal("hex"))
        )
    return _call("encode", d, sql.Literal("hex"))
