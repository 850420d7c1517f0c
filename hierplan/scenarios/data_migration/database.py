"""The sample shop database: 14 tables with foreign keys, about 290,000 rows, deterministic.

Foreign keys make the copy order a DAG: regions before countries, countries before customers,
suppliers and warehouses, customers before addresses and orders, and so on. Categories refer to
themselves (a parent category always has a smaller id, so copying in id order is safe).
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

DATABASE_VERSION = 1

SCHEMA: Mapping[str, str] = {
    "regions": "id INTEGER PRIMARY KEY, name TEXT NOT NULL",
    "countries": "id INTEGER PRIMARY KEY, region_id INTEGER NOT NULL REFERENCES regions(id), "
    "name TEXT NOT NULL, iso TEXT NOT NULL",
    "categories": "id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES categories(id), "
    "name TEXT NOT NULL",
    "suppliers": "id INTEGER PRIMARY KEY, country_id INTEGER NOT NULL REFERENCES countries(id), "
    "name TEXT NOT NULL",
    "warehouses": "id INTEGER PRIMARY KEY, country_id INTEGER NOT NULL REFERENCES countries(id), "
    "name TEXT NOT NULL",
    "customers": "id INTEGER PRIMARY KEY, country_id INTEGER NOT NULL REFERENCES countries(id), "
    "name TEXT NOT NULL, email TEXT NOT NULL, created_at TEXT NOT NULL",
    "addresses": "id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
    "street TEXT NOT NULL, city TEXT NOT NULL, postcode TEXT NOT NULL",
    "products": "id INTEGER PRIMARY KEY, category_id INTEGER NOT NULL REFERENCES categories(id), "
    "supplier_id INTEGER NOT NULL REFERENCES suppliers(id), name TEXT NOT NULL, "
    "price_cents INTEGER NOT NULL",
    "inventory": "warehouse_id INTEGER NOT NULL REFERENCES warehouses(id), "
    "product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL, "
    "PRIMARY KEY (warehouse_id, product_id)",
    "orders": "id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
    "address_id INTEGER NOT NULL REFERENCES addresses(id), placed_at TEXT NOT NULL, "
    "status TEXT NOT NULL",
    "order_items": "id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id), "
    "product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL, "
    "price_cents INTEGER NOT NULL",
    "payments": "id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id), "
    "amount_cents INTEGER NOT NULL, method TEXT NOT NULL, paid_at TEXT NOT NULL",
    "shipments": "id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id), "
    "warehouse_id INTEGER NOT NULL REFERENCES warehouses(id), shipped_at TEXT NOT NULL, "
    "carrier TEXT NOT NULL",
    "reviews": "id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL REFERENCES products(id), "
    "customer_id INTEGER NOT NULL REFERENCES customers(id), rating INTEGER NOT NULL, "
    "body TEXT NOT NULL",
}
SCHEMA = MappingProxyType(SCHEMA)  # read-only: shared by every run

INDEXES: Mapping[str, list[tuple[str, list[str]]]] = {
    "countries": [("ix_countries_region", ["region_id"])],
    "customers": [("ix_customers_country", ["country_id"]), ("ix_customers_email", ["email"])],
    "addresses": [("ix_addresses_customer", ["customer_id"])],
    "products": [
        ("ix_products_category", ["category_id"]),
        ("ix_products_supplier", ["supplier_id"]),
    ],
    "orders": [("ix_orders_customer", ["customer_id"]), ("ix_orders_placed", ["placed_at"])],
    "order_items": [
        ("ix_order_items_order", ["order_id"]),
        ("ix_order_items_product", ["product_id"]),
    ],
    "payments": [("ix_payments_order", ["order_id"])],
    "shipments": [("ix_shipments_order", ["order_id"])],
    "reviews": [("ix_reviews_product", ["product_id"])],
}
INDEXES = MappingProxyType(INDEXES)  # read-only: shared by every run

ROWS: Mapping[str, int] = {
    "regions": 8,
    "countries": 60,
    "categories": 40,
    "suppliers": 300,
    "warehouses": 20,
    "customers": 20_000,
    "addresses": 30_000,
    "products": 5_000,
    "inventory": 20_000,
    "orders": 40_000,
    "order_items": 90_000,
    "payments": 38_000,
    "shipments": 35_000,
    "reviews": 12_000,
}
ROWS = MappingProxyType(ROWS)  # read-only: shared by every run

_WORDS: Sequence[str] = (
    "amber basil cedar delta ember fjord garnet harbor iris juniper kestrel lumen maple nova "
    "onyx pine quartz raven sable tundra umber violet willow xenon yarrow zephyr"
).split()
_WORDS = tuple(_WORDS)


def quote(identifier: str) -> str:
    """Quote an SQL identifier (double quotes, inner quotes doubled)."""
    return '"' + identifier.replace('"', '""') + '"'


@dataclass(slots=True)
class _Gen:
    rng: random.Random

    def word(self) -> str:
        return self.rng.choice(_WORDS)

    def name(self) -> str:
        return f"{self.word().title()} {self.word().title()}"

    def date(self) -> str:
        r = self.rng
        return f"202{r.randrange(0, 6)}-{r.randrange(1, 13):02d}-{r.randrange(1, 29):02d}"


def _rows(table: str, g: _Gen) -> Iterator[tuple[Any, ...]]:
    r = g.rng
    n = ROWS[table]
    makers: dict[str, Callable[[int], tuple[Any, ...]]] = {
        "regions": lambda i: (i, f"Region {g.word()} {i}"),
        "countries": lambda i: (
            i,
            r.randrange(1, ROWS["regions"] + 1),
            f"Country {g.word()} {i}",
            f"C{i:02d}",
        ),
        "categories": lambda i: (i, None if i <= 5 else r.randrange(1, i), f"{g.word()} goods {i}"),
        "suppliers": lambda i: (i, r.randrange(1, ROWS["countries"] + 1), f"{g.name()} Ltd"),
        "warehouses": lambda i: (i, r.randrange(1, ROWS["countries"] + 1), f"Depot {g.word()} {i}"),
        "customers": lambda i: (
            i,
            r.randrange(1, ROWS["countries"] + 1),
            g.name(),
            f"user{i}@example.test",
            g.date(),
        ),
        "addresses": lambda i: (
            i,
            r.randrange(1, ROWS["customers"] + 1),
            f"{r.randrange(1, 999)} {g.word().title()} St",
            g.word().title(),
            f"{r.randrange(10000, 99999)}",
        ),
        "products": lambda i: (
            i,
            r.randrange(1, ROWS["categories"] + 1),
            r.randrange(1, ROWS["suppliers"] + 1),
            f"{g.word()} {g.word()} {i}",
            r.randrange(99, 99999),
        ),
        "orders": lambda i: (
            i,
            r.randrange(1, ROWS["customers"] + 1),
            r.randrange(1, ROWS["addresses"] + 1),
            g.date(),
            r.choice(("new", "paid", "shipped", "done")),
        ),
        "order_items": lambda i: (
            i,
            r.randrange(1, ROWS["orders"] + 1),
            r.randrange(1, ROWS["products"] + 1),
            r.randrange(1, 9),
            r.randrange(99, 99999),
        ),
        "payments": lambda i: (
            i,
            i,
            r.randrange(99, 999999),
            r.choice(("card", "bank", "voucher")),
            g.date(),
        ),
        "shipments": lambda i: (
            i,
            i,
            r.randrange(1, ROWS["warehouses"] + 1),
            g.date(),
            r.choice(("post", "courier", "freight")),
        ),
        "reviews": lambda i: (
            i,
            r.randrange(1, ROWS["products"] + 1),
            r.randrange(1, ROWS["customers"] + 1),
            r.randrange(1, 6),
            " ".join(g.word() for _ in range(8)),
        ),
    }
    if table == "inventory":
        per = ROWS["inventory"] // ROWS["warehouses"]
        for w in range(1, ROWS["warehouses"] + 1):
            for p in r.sample(range(1, ROWS["products"] + 1), per):
                yield (w, p, r.randrange(0, 500))
        return
    make = makers[table]
    for i in range(1, n + 1):
        yield make(i)


def is_built(path: Path, *, seed: int = 0) -> bool:
    """Whether ``path`` holds the sample database :func:`build_source` builds with ``seed``."""
    marker = f"{DATABASE_VERSION}:{seed}"
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            found = conn.execute("SELECT value FROM _meta WHERE key='build'").fetchone()
    except sqlite3.Error:
        return False
    return bool(found and found[0] == marker)


def build_source(path: Path, *, seed: int = 0) -> Path:
    """Create the sample database at ``path`` (atomically); reuse it if already built."""
    if path.exists():
        if is_built(path, seed=seed):
            return path
        path.unlink()
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        gen = _Gen(random.Random(f"shop:{seed}"))
        for table, columns in SCHEMA.items():
            conn.execute(f"CREATE TABLE {quote(table)} ({columns})")
            ncols = len(conn.execute(f"PRAGMA table_info({quote(table)})").fetchall())
            marks = ",".join("?" * ncols)
            conn.executemany(f"INSERT INTO {quote(table)} VALUES ({marks})", _rows(table, gen))
            for name, cols in INDEXES.get(table, []):
                conn.execute(
                    f"CREATE INDEX {quote(name)} ON {quote(table)} ({', '.join(map(quote, cols))})"
                )
        conn.execute("CREATE TABLE _meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO _meta VALUES ('build', ?)", (f"{DATABASE_VERSION}:{seed}",))
        conn.commit()
    finally:
        conn.close()
    tmp.replace(path)
    return path
