"""The masking functions, created in the session's temporary schema while a base is masked.

Built on the built-in ``sha256()``: no extension needed. ``pgo_digest(kind, value, key)`` is
``sha256(key || kind || 0x00 || value)``; the key is random per seed, so the same input gives the
same output in every table of one seed (joins and foreign keys on masked values still match),
while originals cannot be found by hashing guesses. The kind keeps each strategy's outputs
unrelated. Every function is STRICT: NULL stays NULL.
"""

from __future__ import annotations

_FIRST = [
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
_LAST = [
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
_LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco "
    "laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in "
    "voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat "
    "cupidatat non proident, sunt in culpa qui officia deserunt mollit anim id est laborum. "
)


def _array(words: list[str]) -> str:
    return "ARRAY[" + ", ".join(f"'{w}'" for w in words) + "]"


FUNCTIONS = [
    """CREATE FUNCTION pg_temp.pgo_digest(kind text, value text, key bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT sha256(key || convert_to(kind, 'UTF8') || decode('00', 'hex')
                  || convert_to(value, 'UTF8')) $$""",
    # PL/pgSQL: the word lists and the digest are built once per call, where a SQL function
    # with a FROM clause is planned as a query per row (10 times slower, measured).
    """CREATE FUNCTION pg_temp.pgo_pick(words text[], d bytea, i int) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    BEGIN
        RETURN words[1 + (get_byte(d, i) * 256 + get_byte(d, i + 1)) % cardinality(words)];
    END $$""",
    """CREATE FUNCTION pg_temp.pgo_fake_email(value text, key bytea) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT 'u' || left(encode(pg_temp.pgo_digest('email', value, key), 'hex'), 16)
           || '@example.com' $$""",
    f"""CREATE FUNCTION pg_temp.pgo_fake_first_name(value text, key bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    BEGIN
        RETURN pg_temp.pgo_pick({_array(_FIRST)}, pg_temp.pgo_digest('first', value, key), 0);
    END $$""",
    f"""CREATE FUNCTION pg_temp.pgo_fake_last_name(value text, key bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    BEGIN
        RETURN pg_temp.pgo_pick({_array(_LAST)}, pg_temp.pgo_digest('last', value, key), 0);
    END $$""",
    f"""CREATE FUNCTION pg_temp.pgo_fake_name(value text, key bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        d bytea := pg_temp.pgo_digest('name', value, key);
    BEGIN
        RETURN pg_temp.pgo_pick({_array(_FIRST)}, d, 0) || ' '
            || pg_temp.pgo_pick({_array(_LAST)}, d, 2);
    END $$""",
    """CREATE FUNCTION pg_temp.pgo_fake_phone(value text, key bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        d bytea := pg_temp.pgo_digest('phone', value, key);
        masked text := '';
        c text;
    BEGIN
        FOR i IN 1 .. length(value) LOOP
            c := substr(value, i, 1);
            IF ascii(c) BETWEEN 48 AND 57 THEN  -- an ASCII digit, whatever the collation
                masked := masked || chr(48 + get_byte(d, (i - 1) % 32) % 10);
            ELSE
                masked := masked || c;
            END IF;
        END LOOP;
        RETURN masked;
    END $$""",
    f"""CREATE FUNCTION pg_temp.pgo_fake_text(value text, key bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        d bytea := pg_temp.pgo_digest('text', value, key);
        l text := '{_LOREM}';
    BEGIN
        RETURN substr(repeat(l, length(value) / length(l) + 2),
                      1 + (get_byte(d, 0) * 256 + get_byte(d, 1)) % length(l), length(value));
    END $$""",
    """CREATE FUNCTION pg_temp.pgo_hash(value text, key bytea) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(pg_temp.pgo_digest('hash', value, key), 'hex') $$""",
    """CREATE FUNCTION pg_temp.pgo_hash_uuid(value text, key bytea) RETURNS uuid
    LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(substr(pg_temp.pgo_digest('hash', value, key), 1, 16), 'hex')::uuid $$""",
]
