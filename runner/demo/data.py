"""SQL for the product demo's sample database: a small online shop.

Everything here is a pure function returning SQL text; nothing connects to a
server.  The caller creates the database :data:`DEMO_DATABASE`, connects to it
and executes the statements one by one, **in autocommit mode, on one
connection**, in this order::

    for stmt in demo_schema_sql():
        conn.execute(stmt)
    for stmt in demo_data_sql(scale):
        conn.execute(stmt)

Tables (all in schema ``public``)::

    customers    (id PK, email UNIQUE, full_name, phone, country, created_at, ...)
    products     (id PK, sku UNIQUE, name, description, price, category, ...)
    orders       (id PK, customer_id FK, status, placed_at, shipped_at, total, ...)
    order_items  (order_id FK, line_no, product_id FK, quantity, unit_price),
                 PK (order_id, line_no)
    events       (id PK, customer_id FK NULL, event_type, occurred_at, payload jsonb)

Order of work, chosen so that loading is fast:

1. :func:`demo_schema_sql` -- ``CREATE TABLE`` with primary keys, ``NOT NULL``
   and ``CHECK`` constraints only.  No secondary index, unique constraint or
   foreign key yet, so the bulk inserts only maintain one btree per table and
   fire no per-row FK triggers.
2. :func:`demo_data_sql` -- in this order:

   a. ``SET maintenance_work_mem`` (session-level; speeds up index builds),
   b. ``INSERT ... SELECT ... FROM generate_series(...)`` for products,
      customers, order_items, orders (order totals are aggregated from the
      already-loaded items, so no ``UPDATE`` pass bloats the table) and events,
   c. :func:`demo_index_sql`: unique constraints, secondary indexes, then
      foreign keys (each FK is validated by one set-based query),
   d. identity sequences moved past the loaded ids, so that later plain
      ``INSERT``\\ s in the demo work,
   e. ``VACUUM (FREEZE)`` -- sets hint bits, the visibility map and freezes
      all tuples once, so the loaded data is not rewritten later by readers or
      by anti-wraparound autovacuum,
   f. ``ANALYZE``.

``VACUUM`` cannot run inside a transaction block, hence the autocommit
requirement.

All values are generated server-side and deterministically: pseudo-random
numbers come from ``hashint8extended(<row number>, <salt>)`` (PostgreSQL's
portable, value-based 64-bit hash, available since PostgreSQL 11), so the same
``scale`` always yields the same rows.  Timestamps are fixed (2019 .. 2024),
never derived from ``now()``.

Row counts are linear in ``scale`` (see :func:`demo_row_counts`).  Measured on
PostgreSQL 15: scale 1 is about 35 MB of tables + indexes, scale 10 about
350 MB.

The only value interpolated into SQL text is ``scale``, which is validated to
be a real ``int`` in ``1..1000``; everything else is a module constant.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DEMO_DATABASE",
    "MAX_SCALE",
    "MIN_SCALE",
    "demo_data_sql",
    "demo_index_sql",
    "demo_row_counts",
    "demo_schema_sql",
    "demo_tables",
]

DEMO_DATABASE: Final = "shop"

MIN_SCALE: Final = 1
MAX_SCALE: Final = 1000

# Rows per unit of scale.  order_items averages ~3 lines per order (exact
# count is deterministic but not a closed formula; see demo_row_counts).
_CUSTOMERS_PER_SCALE: Final = 20_000
_PRODUCTS_PER_SCALE: Final = 2_000
_ORDERS_PER_SCALE: Final = 45_000
_EVENTS_PER_SCALE: Final = 25_000

# Data spans 2019-01-01 .. 2025-01-01 (UTC), i.e. 2192 days.
_EPOCH: Final = "timestamptz '2019-01-01 00:00:00+00'"
_SPAN_SECONDS: Final = 2192 * 86_400

_TABLES: Final = ("customers", "products", "orders", "order_items", "events")

# Constants embedded in SQL text must not need quoting/escaping.
_SAFE_CONSTANT_RE: Final = re.compile(r"[^'\\\x00]*")


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _check_scale(scale: int) -> int:
    # bool is a subclass of int; reject it (and everything that is not int).
    if isinstance(scale, bool) or not isinstance(scale, int):
        raise ValueError(f"scale must be an int, got {type(scale).__name__}")
    if not MIN_SCALE <= scale <= MAX_SCALE:
        raise ValueError(f"scale must be between {MIN_SCALE} and {MAX_SCALE}, got {scale}")
    return scale


def _arr(words: tuple[str, ...]) -> str:
    """A ``text[]`` literal of module constants (checked to need no escaping)."""
    for w in words:
        if not _SAFE_CONSTANT_RE.fullmatch(w):
            raise AssertionError(f"unexpected character in constant {w!r}")
    return "ARRAY[" + ",".join(f"'{w}'" for w in words) + "]::text[]"


def _h(expr: str, salt: int) -> str:
    """Deterministic non-negative pseudo-random bigint for ``expr``."""
    return f"(hashint8extended(({expr})::bigint, {salt}) & 9223372036854775807)"


def _mod(expr: str, salt: int, n: int) -> str:
    """Deterministic pseudo-random integer in ``[0, n)``."""
    return f"({_h(expr, salt)} % {n})"


def _unit(expr: str, salt: int) -> str:
    """Deterministic pseudo-random float8 in ``[0, 1)``."""
    return f"(({_h(expr, salt)} % 1000000)::float8 / 1000000.0)"


def _pick(array: str, n: int, expr: str, salt: int) -> str:
    """Deterministically pick one of the ``n`` elements of ``array``."""
    return f"({array})[1 + {_mod(expr, salt, n)}]"


# --------------------------------------------------------------------------
# vocabulary
# --------------------------------------------------------------------------

# fmt: off

_FIRST_NAMES: Final = (
    "James", "Mary", "Robert", "Patricia", "John", "Jennifer", "Michael", "Linda",
    "David", "Elizabeth", "William", "Barbara", "Richard", "Susan", "Joseph",
    "Jessica", "Thomas", "Sarah", "Charles", "Karen", "Daniel", "Lisa", "Matthew",
    "Nancy", "Anthony", "Sandra", "Mark", "Ashley", "Steven", "Emily", "Paul",
    "Donna", "Andrew", "Michelle", "Joshua", "Carol", "Kevin", "Amanda", "Brian",
    "Melissa", "Oliver", "Emma", "Lucas", "Sophie", "Noah", "Mia", "Liam", "Hannah",
    "Lukas", "Lena", "Hugo", "Camille", "Mateo", "Lucia", "Sven", "Astrid", "Kenji",
    "Yuki", "Rahul", "Priya", "Pedro", "Ana", "Jan", "Zofia", "Ethan", "Chloe",
)

_LAST_NAMES: Final = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis",
    "Rodriguez", "Martinez", "Hernandez", "Lopez", "Gonzalez", "Wilson", "Anderson",
    "Taylor", "Moore", "Jackson", "Martin", "Lee", "Thompson", "White", "Harris",
    "Clark", "Lewis", "Robinson", "Walker", "Young", "Allen", "King", "Wright",
    "Scott", "Green", "Baker", "Adams", "Nelson", "Hill", "Campbell", "Mitchell",
    "Roberts", "Carter", "Phillips", "Evans", "Turner", "Parker", "Collins",
    "Mueller", "Schmidt", "Schneider", "Fischer", "Dubois", "Moreau", "Laurent",
    "Rossi", "Russo", "Bianchi", "Jansen", "Visser", "Andersson", "Johansson",
    "Nowak", "Kowalski", "Tanaka", "Suzuki", "Sato", "Sharma", "Patel", "Silva",
    "Santos", "Fernandez", "Murphy", "Kelly",
)

_EMAIL_DOMAINS: Final = (
    "gmail.com", "gmail.com", "gmail.com", "outlook.com", "yahoo.com", "hotmail.com",
    "icloud.com", "proton.me", "gmx.de", "web.de", "orange.fr", "libero.it",
    "example.com", "example.org", "mail.com", "fastmail.com",
)

# Weighted: an entry appears as often as it should be picked.
_COUNTRIES: Final = (
    "US", "US", "US", "US", "US", "US", "GB", "GB", "GB", "DE", "DE", "DE", "FR",
    "FR", "NL", "SE", "ES", "ES", "IT", "IT", "CA", "CA", "AU", "JP", "BR", "IN",
    "PL", "IE",
)
_CALLING_CODES: Final = {
    "US": "1", "GB": "44", "DE": "49", "FR": "33", "NL": "31", "SE": "46",
    "ES": "34", "IT": "39", "CA": "1", "AU": "61", "JP": "81", "BR": "55",
    "IN": "91", "PL": "48", "IE": "353",
}

_CATEGORIES: Final = (
    "Electronics", "Books", "Home & Kitchen", "Clothing", "Sports", "Toys",
    "Beauty", "Garden", "Office", "Grocery",
)
# One noun list per category, same order as _CATEGORIES (5 nouns each).
_NOUNS: Final = (
    "Headphones", "Charger", "Keyboard", "Webcam", "Speaker",
    "Notebook", "Cookbook", "Novel", "Atlas", "Journal",
    "Kettle", "Skillet", "Blender", "Mug Set", "Knife Block",
    "T-Shirt", "Hoodie", "Jacket", "Socks", "Sneakers",
    "Yoga Mat", "Water Bottle", "Dumbbell", "Tennis Racket", "Backpack",
    "Puzzle", "Building Blocks", "Plush Bear", "Board Game", "Kite",
    "Face Cream", "Shampoo", "Lip Balm", "Perfume", "Hair Brush",
    "Garden Hose", "Planter", "Pruning Shears", "Bird Feeder", "Seed Kit",
    "Desk Lamp", "Stapler", "Pen Set", "Monitor Stand", "Desk Organizer",
    "Coffee Beans", "Green Tea", "Olive Oil", "Dark Chocolate", "Granola",
)
_NOUNS_PER_CATEGORY: Final = 5
_ADJECTIVES: Final = (
    "Classic", "Premium", "Compact", "Deluxe", "Eco", "Essential", "Ultra", "Pro",
    "Vintage", "Modern", "Smart", "Travel", "Organic", "Heavy-Duty", "Mini",
    "Everyday", "Signature", "Lightweight", "Handmade", "Wireless",
)
_COLORS: Final = (
    "Black", "White", "Navy", "Red", "Forest Green", "Sand", "Slate Grey",
    "Sky Blue", "Charcoal", "Olive", "Coral", "Walnut",
)
_DESC_OPENERS: Final = (
    "Designed for everyday use, this item combines durability with a clean, timeless look.",
    "Our best-selling model, refined over several seasons based on customer feedback.",
    "A thoughtful upgrade to a household staple, built to last for years.",
    "Made from carefully sourced materials and assembled with attention to detail.",
    "Lightweight and practical, it fits easily into a busy routine.",
    "A customer favourite that balances quality, comfort and value.",
    "Crafted in small batches by a family-run workshop.",
    "Built to a higher standard than the usual alternatives, without the premium price.",
)
_DESC_MIDDLES: Final = (
    "It is easy to clean and ships in plastic-free, recyclable packaging.",
    "Every unit is inspected by hand before it leaves our warehouse.",
    "The finish resists scratches, fading and everyday wear.",
    "Pairs well with the rest of the collection and makes a great gift.",
    "Compatible with most standard accessories sold in our store.",
    "Independent testers rated it highly for reliability and ease of use.",
    "Suitable for beginners and experienced users alike.",
    "The compact design saves space at home, at work or on the road.",
)
_DESC_CLOSERS: Final = (
    "Backed by a two-year warranty and free returns within 30 days.",
    "Free shipping on orders over 50, and easy returns.",
    "Includes a quick-start guide and responsive customer support.",
    "Limited stock: popular colours tend to sell out quickly.",
    "Care instructions are included in the box.",
    "Ships within one business day from our regional warehouse.",
)

_EVENT_TYPES: Final = (
    "page_view", "page_view", "page_view", "page_view", "product_view",
    "product_view", "product_view", "search", "search", "add_to_cart",
    "add_to_cart", "login", "logout", "checkout_started", "review_posted",
    "password_reset",
)
_SEARCH_TERMS: Final = (
    "wireless headphones", "coffee", "yoga mat", "gift ideas", "desk lamp",
    "running shoes", "board game", "kettle", "phone charger", "organic tea",
    "backpack", "perfume", "garden hose", "notebook", "sale",
)
_PAGES: Final = (
    "/", "/", "/deals", "/cart", "/account", "/account/orders", "/help/shipping",
    "/help/returns", "/blog/gift-guide", "/category/electronics",
    "/category/books", "/category/home-kitchen", "/category/clothing",
)
_USER_AGENTS: Final = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/120.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_2) Safari/17.2",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) Mobile Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) Chrome/120.0 Mobile",
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Firefox/121.0",
    "ShopApp/4.2.1 (iOS 17.2)",
    "ShopApp/4.2.0 (Android 14)",
)
# Order status of the newest 0.25% of orders, and of the 1% before those.
_RECENT_STATUSES: Final = ("pending", "paid", "paid", "shipped", "shipped", "shipped")
_LATE_STATUSES: Final = ("paid", "shipped", "shipped", "delivered", "delivered", "cancelled")
_REVIEW_TAGS: Final = ("fast_shipping", "good_value", "as_described", "gift")
_LOGIN_METHODS: Final = ("password", "password", "google", "apple")
_REFERRERS: Final = (
    "direct", "direct", "google", "google", "google", "newsletter", "instagram",
    "facebook", "bing", "partner-blog",
)

# fmt: on

# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def demo_tables() -> tuple[str, ...]:
    """Names of the demo tables, in dependency order (parents first)."""
    return ("products", "customers", "orders", "order_items", "events")


def demo_row_counts(scale: int) -> dict[str, int]:
    """Exact row counts per table for ``scale``, except ``order_items``.

    ``order_items`` holds 1..5 lines per order (about 2.5 on average); the value
    given for it is a lower bound (one line per order).
    """
    s = _check_scale(scale)
    return {
        "customers": _CUSTOMERS_PER_SCALE * s,
        "products": _PRODUCTS_PER_SCALE * s,
        "orders": _ORDERS_PER_SCALE * s,
        "order_items": _ORDERS_PER_SCALE * s,
        "events": _EVENTS_PER_SCALE * s,
    }


def demo_schema_sql() -> list[str]:
    """``CREATE TABLE`` statements (primary keys and checks only).

    Run these first, in a fresh, empty :data:`DEMO_DATABASE`.  Unique
    constraints, secondary indexes and foreign keys are deliberately created
    after the bulk load, by :func:`demo_data_sql` (see :func:`demo_index_sql`).
    Ids are ``GENERATED BY DEFAULT AS IDENTITY`` so the loader can insert
    explicit ids and demo users can still insert rows without giving one.
    """
    return [
        """CREATE TABLE products (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    sku         text           NOT NULL,
    name        text           NOT NULL,
    description text           NOT NULL,
    category    text           NOT NULL,
    price       numeric(10, 2) NOT NULL CHECK (price >= 0),
    stock       integer        NOT NULL DEFAULT 0 CHECK (stock >= 0),
    active      boolean        NOT NULL DEFAULT true,
    created_at  timestamptz    NOT NULL DEFAULT now()
)""",
        """CREATE TABLE customers (
    id               bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    email            text        NOT NULL,
    full_name        text        NOT NULL,
    phone            text,
    country          char(2)     NOT NULL,
    marketing_opt_in boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now()
)""",
        """CREATE TABLE orders (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    customer_id bigint         NOT NULL,
    status      text           NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'paid', 'shipped', 'delivered',
                                  'cancelled', 'refunded')),
    placed_at   timestamptz    NOT NULL DEFAULT now(),
    shipped_at  timestamptz,
    total       numeric(12, 2) NOT NULL DEFAULT 0 CHECK (total >= 0)
)""",
        """CREATE TABLE order_items (
    order_id   bigint         NOT NULL,
    line_no    smallint       NOT NULL CHECK (line_no > 0),
    product_id bigint         NOT NULL,
    quantity   integer        NOT NULL CHECK (quantity > 0),
    unit_price numeric(10, 2) NOT NULL CHECK (unit_price >= 0),
    PRIMARY KEY (order_id, line_no)
)""",
        """CREATE TABLE events (
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    customer_id bigint,
    event_type  text        NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    payload     jsonb       NOT NULL DEFAULT '{}'::jsonb
)""",
    ]


def demo_index_sql() -> list[str]:
    """Unique constraints, secondary indexes and foreign keys.

    Included in :func:`demo_data_sql` right after the inserts; exposed
    separately for callers that want to load data in another way.
    """
    return [
        "ALTER TABLE products ADD CONSTRAINT products_sku_key UNIQUE (sku)",
        "CREATE INDEX products_category_idx ON products (category)",
        "ALTER TABLE customers ADD CONSTRAINT customers_email_key UNIQUE (email)",
        "CREATE INDEX customers_country_idx ON customers (country)",
        "CREATE INDEX customers_created_at_idx ON customers (created_at)",
        "CREATE INDEX orders_customer_id_idx ON orders (customer_id)",
        "CREATE INDEX orders_placed_at_idx ON orders (placed_at)",
        "CREATE INDEX orders_open_status_idx ON orders (status) "
        "WHERE status IN ('pending', 'paid', 'shipped')",
        "CREATE INDEX order_items_product_id_idx ON order_items (product_id)",
        "CREATE INDEX events_customer_id_occurred_at_idx ON events (customer_id, occurred_at)",
        "CREATE INDEX events_occurred_at_brin ON events USING brin (occurred_at)",
        "ALTER TABLE orders ADD CONSTRAINT orders_customer_id_fkey "
        "FOREIGN KEY (customer_id) REFERENCES customers (id)",
        "ALTER TABLE order_items ADD CONSTRAINT order_items_order_id_fkey "
        "FOREIGN KEY (order_id) REFERENCES orders (id) ON DELETE CASCADE",
        "ALTER TABLE order_items ADD CONSTRAINT order_items_product_id_fkey "
        "FOREIGN KEY (product_id) REFERENCES products (id)",
        "ALTER TABLE events ADD CONSTRAINT events_customer_id_fkey "
        "FOREIGN KEY (customer_id) REFERENCES customers (id) ON DELETE SET NULL",
    ]


def demo_data_sql(scale: int) -> list[str]:
    """Statements that fill the tables created by :func:`demo_schema_sql`.

    Order: ``SET maintenance_work_mem``; inserts into products, customers,
    order_items, orders, events; :func:`demo_index_sql`; identity sequence
    resets; ``VACUUM (FREEZE)``; ``ANALYZE`` (always the last statement).
    Must be run in autocommit mode on a single connection.

    Raises ``ValueError`` unless ``scale`` is an ``int`` in ``1..1000``.
    """
    s = _check_scale(scale)
    n_cust = _CUSTOMERS_PER_SCALE * s
    n_prod = _PRODUCTS_PER_SCALE * s
    n_ord = _ORDERS_PER_SCALE * s
    n_evt = _EVENTS_PER_SCALE * s
    span = _SPAN_SECONDS

    stmts: list[str] = ["SET maintenance_work_mem = '256MB'"]
    stmts.append(_products_sql(n_prod, span))
    stmts.append(_customers_sql(n_cust, span))
    stmts.append(_order_items_sql(n_ord, n_prod))
    stmts.append(_orders_sql(n_ord, n_cust, span))
    stmts.append(_events_sql(n_evt, n_cust, n_prod, span))
    stmts.extend(demo_index_sql())
    for table in ("products", "customers", "orders", "events"):
        stmts.append(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"(SELECT coalesce(max(id), 0) + 1 FROM {table}), false)"
        )
    stmts.append("VACUUM (FREEZE)")
    stmts.append("ANALYZE")
    return stmts


# --------------------------------------------------------------------------
# per-table generators
# --------------------------------------------------------------------------


def _products_sql(n_prod: int, span: int) -> str:
    n_cat = len(_CATEGORIES)
    cats = _arr(_CATEGORIES)
    nouns = _arr(_NOUNS)
    # Products were added to the catalogue during the first ~90% of the span.
    return f"""INSERT INTO products
    (id, sku, name, description, category, price, stock, active, created_at)
SELECT i,
       'SKU-' || upper(left(regexp_replace(cat, '[^A-Za-z]', '', 'g'), 3))
           || '-' || lpad(i::text, 7, '0'),
       {_pick(_arr(_ADJECTIVES), len(_ADJECTIVES), "i", 101)} || ' '
           || ({nouns})[1 + ci * {_NOUNS_PER_CATEGORY} + {_mod("i", 102, _NOUNS_PER_CATEGORY)}]
           || ', ' || {_pick(_arr(_COLORS), len(_COLORS), "i", 103)},
       {_pick(_arr(_DESC_OPENERS), len(_DESC_OPENERS), "i", 104)} || ' '
           || {_pick(_arr(_DESC_MIDDLES), len(_DESC_MIDDLES), "i", 105)} || ' '
           || {_pick(_arr(_DESC_MIDDLES), len(_DESC_MIDDLES), "i", 106)} || ' '
           || {_pick(_arr(_DESC_CLOSERS), len(_DESC_CLOSERS), "i", 107)},
       cat,
       (floor(2 + power({_unit("i", 108)}, 3) * 400) + 0.99)::numeric(10, 2),
       CASE WHEN {_mod("i", 109, 20)} = 0 THEN 0 ELSE {_mod("i", 110, 500)}::int END,
       {_mod("i", 111, 25)} <> 0,
       {_EPOCH} + make_interval(secs => floor({_unit("i", 112)} * {span} * 0.9))
FROM (SELECT i, ci, ({cats})[1 + ci] AS cat
      FROM (SELECT i, {_mod("i", 100, n_cat)}::int AS ci
            FROM generate_series(1, {n_prod}) AS i) AS a) AS g"""


def _customers_sql(n_cust: int, span: int) -> str:
    countries = _arr(_COUNTRIES)
    codes = _arr(tuple(_CALLING_CODES[c] for c in _COUNTRIES))
    # created_at grows with id (so orders can be placed after sign-up) and is
    # jittered *backwards* by up to a day (never before the epoch).
    return f"""INSERT INTO customers
    (id, email, full_name, phone, country, marketing_opt_in, created_at)
SELECT i,
       lower(CASE fmt
                 WHEN 0 THEN fn || '.' || ln
                 WHEN 1 THEN fn || '_' || ln
                 WHEN 2 THEN left(fn, 1) || ln
                 ELSE ln || '.' || fn
             END) || i::text || '@' || {_pick(_arr(_EMAIL_DOMAINS), len(_EMAIL_DOMAINS), "i", 203)},
       fn || ' ' || ln,
       CASE WHEN {_mod("i", 204, 12)} = 0 THEN NULL
            ELSE '+' || ({codes})[ci] || ' ' || (100 + {_mod("i", 205, 900)})::text
                 || ' ' || lpad({_mod("i", 206, 1000)}::text, 3, '0')
                 || ' ' || lpad({_mod("i", 207, 10000)}::text, 4, '0')
       END,
       ({countries})[ci],
       {_mod("i", 208, 3)} = 0,
       {_EPOCH} + make_interval(secs => greatest(0, floor((i - 1)::float8 / {n_cust} * {span}
                                                          - {_unit("i", 209)} * 86400)))
FROM (SELECT i,
             {_pick(_arr(_FIRST_NAMES), len(_FIRST_NAMES), "i", 200)} AS fn,
             {_pick(_arr(_LAST_NAMES), len(_LAST_NAMES), "i", 201)} AS ln,
             {_mod("i", 202, 4)}::int AS fmt,
             1 + {_mod("i", 210, len(_COUNTRIES))}::int AS ci
      FROM generate_series(1, {n_cust}) AS i) AS g"""


def _order_items_sql(n_ord: int, n_prod: int) -> str:
    # 1..5 lines per order, skewed towards few lines; popular products are
    # picked more often (u^2 skew); 1 in 8 lines is discounted by 10-20%.
    return f"""INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price)
SELECT g.o, g.l, p.id,
       CASE WHEN {_mod("k", 301, 10)} < 7 THEN 1 ELSE 2 + {_mod("k", 302, 3)}::int END,
       CASE WHEN {_mod("k", 303, 8)} = 0
            THEN round(p.price * (0.8 + {_mod("k", 304, 3)} * 0.05), 2)
            ELSE p.price
       END
FROM (SELECT o, l, o * 8 + l AS k,
             1 + floor(power({_unit("o * 8 + l", 300)}, 2) * {n_prod})::bigint AS pid
      FROM generate_series(1, {n_ord}) AS o,
           LATERAL generate_series(1, 1 + floor(power({_unit("o", 305)}, 1.5) * 5)::int) AS l
     ) AS g
JOIN products AS p ON p.id = g.pid"""


def _orders_sql(n_ord: int, n_cust: int, span: int) -> str:
    # Order o is placed at (o-1)/n_ord of the span (+ up to 6 h), and its
    # customer is one with (cid-1)/n_cust <= (o-1)/n_ord, i.e. who signed up
    # before the order was placed.  Older customers accumulate more orders.
    # Recent orders are still pending/paid/shipped; older ones are mostly
    # delivered, some cancelled or refunded.
    return f"""INSERT INTO orders (id, customer_id, status, placed_at, shipped_at, total)
SELECT g.o, g.cid, g.status, g.placed_at,
       CASE WHEN g.status IN ('shipped', 'delivered', 'refunded')
            THEN g.placed_at + make_interval(secs => 3600 * (6 + {_mod("g.o", 404, 90)}))
       END,
       coalesce(t.total, 0)
FROM (SELECT o,
             1 + floor({_unit("o", 400)} * (o - 1)::float8 / {n_ord} * {n_cust})::bigint AS cid,
             {_EPOCH} + make_interval(secs => floor((o - 1)::float8 / {n_ord} * {span}
                                                    + {_unit("o", 401)} * 21600)) AS placed_at,
             CASE
                 WHEN o > {n_ord} - {max(n_ord // 400, 1)}
                     THEN {_pick(_arr(_RECENT_STATUSES), len(_RECENT_STATUSES), "o", 402)}
                 WHEN o > {n_ord} - {max(n_ord // 100, 1)}
                     THEN {_pick(_arr(_LATE_STATUSES), len(_LATE_STATUSES), "o", 402)}
                 ELSE CASE WHEN {_mod("o", 403, 100)} < 4 THEN 'cancelled'
                           WHEN {_mod("o", 403, 100)} < 6 THEN 'refunded'
                           ELSE 'delivered' END
             END AS status
      FROM generate_series(1, {n_ord}) AS o) AS g
LEFT JOIN (SELECT order_id, sum(quantity * unit_price) AS total
           FROM order_items GROUP BY order_id) AS t ON t.order_id = g.o"""


def _events_sql(n_evt: int, n_cust: int, n_prod: int, span: int) -> str:
    # Anonymous visitors (customer_id NULL) for 1 in 5 events.  The customer of
    # event e is one who had signed up by then (same trick as for orders).
    return f"""INSERT INTO events (id, customer_id, event_type, occurred_at, payload)
SELECT e,
       CASE WHEN {_mod("e", 501, 5)} = 0 THEN NULL ELSE
           1 + floor({_unit("e", 502)} * (e - 1)::float8 / {n_evt} * {n_cust})::bigint END,
       etype,
       {_EPOCH} + make_interval(secs => floor((e - 1)::float8 / {n_evt} * {span}
                                              + {_unit("e", 503)} * 3600)),
       jsonb_build_object(
           'session_id', md5('session' || ({_mod("e", 504, 1000000000)})::text)::uuid,
           'ip', '198.51.' || {_mod("e", 505, 256)} || '.' || {_mod("e", 506, 256)},
           'user_agent', {_pick(_arr(_USER_AGENTS), len(_USER_AGENTS), "e", 507)},
           'referrer', {_pick(_arr(_REFERRERS), len(_REFERRERS), "e", 508)},
           'duration_ms', 20 + {_mod("e", 509, 4000)})
       || CASE etype
              WHEN 'page_view' THEN jsonb_build_object(
                  'path', {_pick(_arr(_PAGES), len(_PAGES), "e", 510)})
              WHEN 'product_view' THEN jsonb_build_object(
                  'path', '/products/' || pid, 'product_id', pid)
              WHEN 'search' THEN jsonb_build_object(
                  'query', {_pick(_arr(_SEARCH_TERMS), len(_SEARCH_TERMS), "e", 511)},
                  'results', {_mod("e", 512, 200)})
              WHEN 'add_to_cart' THEN jsonb_build_object(
                  'product_id', pid, 'quantity', 1 + {_mod("e", 513, 3)})
              WHEN 'review_posted' THEN jsonb_build_object(
                  'product_id', pid, 'rating', 1 + {_mod("e", 514, 5)},
                  'tags', jsonb_build_array('verified_purchase',
                      {_pick(_arr(_REVIEW_TAGS), len(_REVIEW_TAGS), "e", 515)}))
              WHEN 'login' THEN jsonb_build_object(
                  'method', {_pick(_arr(_LOGIN_METHODS), len(_LOGIN_METHODS), "e", 516)},
                  'mfa', {_mod("e", 517, 3)} = 0)
              ELSE '{{}}'::jsonb
          END
FROM (SELECT e,
             {_pick(_arr(_EVENT_TYPES), len(_EVENT_TYPES), "e", 500)} AS etype,
             1 + floor(power({_unit("e", 518)}, 2) * {n_prod})::bigint AS pid
      FROM generate_series(1, {n_evt}) AS e) AS g"""
