"""The built-in bench prompt set: code edits of three shapes, summaries, open chats, short prompts, new code,
JSON extracted under a schema, and an editor's fill-in-the-middle autocomplete."""

from __future__ import annotations

from typing import Any

_CODE = '''import json
from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)

    def add_item(self, name: str, price: float, quantity: int = 1) -> Item:
        """Add quantity of an item, creating it when it is new."""
        item = self.items.get(name)
        if item is None:
            item = Item(name, price, 0)
            self.items[name] = item
        item.quantity += quantity
        return item

    def remove_item(self, name: str, quantity: int = 1) -> None:
        """Remove quantity of an item; drop it when none is left."""
        item = self.items[name]
        if quantity > item.quantity:
            raise ValueError(f"only {item.quantity} of {name} left")
        item.quantity -= quantity
        if item.quantity == 0:
            del self.items[name]

    def total_value(self) -> float:
        """The value of everything in stock."""
        return sum(item.price * item.quantity for item in self.items.values())

    def to_json(self) -> str:
        return json.dumps({name: vars(item) for name, item in self.items.items()})


def load_inventory(text: str) -> Inventory:
    inventory = Inventory()
    for name, data in json.loads(text).items():
        inventory.add_item(name, data["price"], data["quantity"])
    return inventory
'''

_DOC = """The city council met on Tuesday to discuss the proposed expansion of the public library system.
The plan would add three branch libraries in the northern districts, extend opening hours at the
central library to 10 p.m. on weekdays, and create a mobile library service for the rural areas at
the edge of the city. Supporters argued that the northern districts have grown by nearly forty
percent in the last decade while library capacity has not changed, and that students currently
travel more than an hour to reach a quiet place to study. Opponents raised concerns about the cost,
estimated at 48 million over five years, and asked whether digital services could meet the same
needs for less money. The library director presented survey results showing that 71 percent of
residents visited a library at least once last year, and that demand for study rooms exceeds
supply by a factor of three during exam periods. After four hours of debate the council voted
seven to four to fund the first branch library and the extended hours, and to revisit the mobile
service and the remaining two branches in next year's budget."""

_RENAME = '''"""A token bucket that limits how often clients may call an API."""

import threading
import time


class TokenBucket:
    """A TokenBucket holds up to `capacity` tokens and refills at `rate` tokens per second.

    Each request takes one token from the TokenBucket; when the TokenBucket is empty the
    request must wait. One TokenBucket is shared by all threads of a client.
    """

    def __init__(self, capacity: int, rate: float) -> None:
        """Create a full TokenBucket of `capacity` tokens refilling at `rate` per second."""
        if capacity <= 0 or rate <= 0:
            raise ValueError("a TokenBucket needs a positive capacity and rate")
        self.capacity = capacity
        self.rate = rate
        self.tokens = float(capacity)
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def _refill(self) -> None:
        """Add the tokens earned since the TokenBucket was last refilled."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def try_take(self, n: int = 1) -> bool:
        """Take n tokens from the TokenBucket if it holds them; return whether it did."""
        with self.lock:
            self._refill()
            if self.tokens >= n:
                self.tokens -= n
                return True
            return False

    def take(self, n: int = 1, timeout: float | None = None) -> bool:
        """Wait until the TokenBucket holds n tokens and take them (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_take(n):
            with self.lock:
                wait = (n - self.tokens) / self.rate
            if deadline is not None and time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)
        return True

    def __repr__(self) -> str:
        return f"TokenBucket(capacity={self.capacity}, rate={self.rate}, tokens={self.tokens:.1f})"


def bucket_for(requests_per_minute: int) -> TokenBucket:
    """A TokenBucket that allows `requests_per_minute` requests, in bursts of up to a tenth of them."""
    return TokenBucket(max(1, requests_per_minute // 10), requests_per_minute / 60)


def limited(bucket: TokenBucket, func):
    """Wrap func so that every call first takes a token from the TokenBucket."""
    def wrapper(*args, **kwargs):
        bucket.take()
        return func(*args, **kwargs)
    return wrapper
'''

_UNTYPED = """import csv
import statistics
from collections import defaultdict


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def parse_amount(text):
    text = text.strip().replace(",", "")
    if text.startswith("(") and text.endswith(")"):
        return -float(text[1:-1])
    return float(text)


def group_by(rows, key):
    groups = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return dict(groups)


def totals(groups, field):
    return {name: sum(parse_amount(r[field]) for r in rows) for name, rows in groups.items()}


def summary(values):
    if not values:
        return None
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def top(mapping, n=5):
    return sorted(mapping.items(), key=lambda item: item[1], reverse=True)[:n]


def report(path, key="category", field="amount"):
    rows = read_rows(path)
    by_key = totals(group_by(rows, key), field)
    amounts = [parse_amount(r[field]) for r in rows]
    lines = [f"{name}: {value:.2f}" for name, value in top(by_key)]
    stats = summary(amounts)
    if stats:
        lines.append(f"{stats['count']} rows, mean {stats['mean']:.2f}, median {stats['median']:.2f}")
    return "\\n".join(lines)
"""

_BUGGY = '''"""A small in-memory key-value store with expiry, snapshots and a command parser."""

import json
import time
from dataclasses import dataclass, field


class StoreError(Exception):
    """A command the store cannot carry out."""


@dataclass
class Entry:
    value: str
    expires_at: float | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass
class Store:
    entries: dict[str, Entry] = field(default_factory=dict)
    clock: object = time.monotonic

    def _now(self) -> float:
        return self.clock()

    def _live(self, key: str) -> Entry | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.expired(self._now()):
            del self.entries[key]
            return None
        return entry

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        if ttl is not None and ttl <= 0:
            raise StoreError("ttl must be positive")
        expires = None if ttl is None else self._now() + ttl
        self.entries[key] = Entry(value, expires)

    def get(self, key: str) -> str | None:
        entry = self._live(key)
        return entry.value if entry else None

    def delete(self, key: str) -> bool:
        return self.entries.pop(key, None) is not None

    def incr(self, key: str, by: int = 1) -> int:
        entry = self._live(key)
        current = int(entry.value) if entry else 0
        new = current + by
        self.entries[key] = Entry(str(new), entry.expires_at if entry else None)
        return new

    def ttl(self, key: str) -> float | None:
        entry = self._live(key)
        if entry is None or entry.expires_at is None:
            return None
        return max(0.0, entry.expires_at - self._now())

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in list(self.entries) if k.startswith(prefix) and self._live(k))

    def purge(self) -> int:
        now = self._now()
        dead = [k for k, e in self.entries.items() if e.expired(now)]
        for k in dead:
            del self.entries[k]
        return len(dead)

    def snapshot(self) -> str:
        now = self._now()
        data = {}
        for key, entry in self.entries.items():
            if entry.expired(now):
                continue
            remaining = None if entry.expires_at is None else entry.expires_at - now
            data[key] = {"value": entry.value, "ttl": remaining}
        return json.dumps(data, sort_keys=True)

    def restore(self, text: str) -> None:
        data = json.loads(text)
        self.entries.clear()
        for key, item in data.items():
            self.set(key, item["value"], item["ttl"])


def parse_command(line: str) -> tuple[str, list[str]]:
    parts = line.strip().split()
    if not parts:
        raise StoreError("empty command")
    return parts[0].upper(), parts[1:]


def execute(store: Store, line: str) -> str:
    name, args = parse_command(line)
    if name == "SET":
        if len(args) not in (2, 3):
            raise StoreError("usage: SET key value [ttl]")
        ttl = float(args[2]) if len(args) == 3 else None
        store.set(args[0], args[1], ttl)
        return "OK"
    if name == "GET":
        if len(args) != 1:
            raise StoreError("usage: GET key")
        value = store.get(args[0])
        return "(nil)" if value is None else value
    if name == "DEL":
        if len(args) != 1:
            raise StoreError("usage: DEL key")
        return "1" if store.delete(args[0]) else "0"
    if name == "INCR":
        if len(args) not in (1, 2):
            raise StoreError("usage: INCR key [by]")
        by = int(args[1]) if len(args) == 2 else 1
        return str(store.incr(args[0], by))
    if name == "TTL":
        if len(args) != 1:
            raise StoreError("usage: TTL key")
        remaining = store.ttl(args[0])
        return "-1" if remaining is None else f"{remaining:.1f}"
    if name == "KEYS":
        return " ".join(store.keys(args[0] if args else ""))
    if name == "PURGE":
        return str(store.purge())
    raise StoreError(f"unknown command {name}")


def repl(store: Store | None = None) -> None:
    store = store or Store()
    while True:
        try:
            line = input("> ")
        except EOFError:
            return
        if not line.strip():
            continue
        try:
            print(execute(store, line))
        except (StoreError, ValueError) as e:
            print(f"error: {e}")
'''

_INCIDENT = """Incident report: checkout outage, 14 March

Summary: between 09:12 and 10:47 UTC about 38 percent of checkout requests failed with HTTP 502
errors. The cause was a configuration change to the payment gateway's connection pool, deployed at
09:05, which lowered the maximum number of open connections from 200 to 20. Under the morning peak
of roughly 1,400 requests per second the pool was exhausted, requests queued for longer than the
load balancer's 30-second timeout, and the load balancer returned 502 errors to customers.

Timeline: at 09:12 the error-rate alert fired for the checkout service. The on-call engineer first
suspected the database, because its CPU usage had risen to 85 percent, and spent 40 minutes
investigating slow queries that turned out to be a symptom, not the cause. At 09:58 a second
engineer noticed the pool-exhaustion warnings in the gateway logs. The configuration change was
rolled back at 10:31, and error rates returned to normal by 10:47.

Impact: an estimated 52,000 orders failed, of which 61 percent were retried successfully by
customers within the hour. Estimated lost revenue is 310,000 euros.

Actions: add the connection pool size to the deployment checklist; alert on pool exhaustion
directly; require a second reviewer for gateway configuration changes; and add a runbook entry
that tells on-call engineers to check recent deployments before investigating the database."""


_CUSTOMERS = """Notes from the account review, 2 December:

- Maria Fernandez (account AC-20931) moved to the Premium Annual plan in March. She prefers to be reached by
  email, has bought 14 times in total, last logged in on 2024-11-28 and reads the newsletter.
- Account AC-18820 belongs to Tobias Klein, still on Basic Monthly. He only answers the telephone, has made
  3 purchases, last logged in on 2024-10-02 and unsubscribed from the newsletter.
- Priya Raman, account AC-31007, Enterprise Custom since last year. Contact by email. 57 purchases, last login
  2024-12-01, newsletter subscriber.
- Account AC-09415 (Jonas Berg): Basic Monthly, wants postal mail, 1 purchase, last login 2024-06-17, no
  newsletter.
- Aiko Tanaka, account AC-27764, Premium Annual, telephone, 22 purchases, last login 2024-11-30, newsletter
  subscriber."""

CUSTOMER_SCHEMA = {
    "type": "array",
    "minItems": 5,
    "maxItems": 5,
    "items": {
        "type": "object",
        "properties": {
            "customer_full_name": {"type": "string"},
            "customer_account_identifier": {"type": "string"},
            "subscription_plan_level": {"enum": ["basic_monthly", "premium_annual", "enterprise_custom"]},
            "preferred_contact_method": {"enum": ["email", "telephone", "postal_mail"]},
            "total_lifetime_purchases": {"type": "integer"},
            "most_recent_login_date": {"type": "string"},
            "newsletter_subscription_status": {"type": "boolean"},
        },
        "required": [
            "customer_full_name",
            "customer_account_identifier",
            "subscription_plan_level",
            "preferred_contact_method",
            "total_lifetime_purchases",
            "most_recent_login_date",
            "newsletter_subscription_status",
        ],
        "additionalProperties": False,
    },
}

STRUCTURED_PROMPT: dict[str, Any] = {
    "task": "json-extract",
    "prompt": "Extract the five customers in these notes as JSON records, in the order they appear.\n\n" + _CUSTOMERS,
    "response_format": {"type": "json_schema", "json_schema": {"name": "customers", "schema": CUSTOMER_SCHEMA}},
}


def _fim(task: str, module: str, line: int, removed: int = 3) -> dict[str, Any]:
    """An editor's autocomplete request: the caret at `line` of `module`, the `removed` lines after it gone (the
    middle the model writes), the rest of the file as the suffix."""
    lines = module.splitlines(keepends=True)
    return {"task": task, "prompt": "".join(lines[:line]), "suffix": "".join(lines[line + removed :])}


# Fill-in-the-middle: three lines taken out of a function body in each module, as an editor sends them.
FIM_PROMPTS: list[dict[str, Any]] = [
    _fim("fim-refill", _RENAME, 24),
    _fim("fim-wait", _RENAME, 44),
    _fim("fim-add", _CODE, 16),
    _fim("fim-incr", _BUGGY, 51),
    _fim("fim-set", _BUGGY, 100),
    _fim("fim-group", _UNTYPED, 20),
]


BUILTIN_PROMPTS: list[dict[str, Any]] = [
    {
        "task": "edit-rename",
        "prompt": "Rename the class `TokenBucket` to `RateLimiter` everywhere in this "
        "module, in the code, the docstrings and the messages. Reply with the complete updated module only.\n\n"
        "```python\n" + _RENAME + "```",
    },
    {
        "task": "edit-types",
        "prompt": "Add type hints to every function in this module (parameters and return "
        "types), changing nothing else. Reply with the complete module only.\n\n```python\n" + _UNTYPED + "```",
    },
    {
        "task": "edit-bugfix",
        "prompt": "There is one bug in this file: `incr` on a key whose entry has expired "
        "keeps the old expiry, so the new value vanishes at once. Fix it and reply with the complete corrected "
        "file only.\n\n```python\n" + _BUGGY + "```",
    },
    {
        "task": "edit-code",
        "prompt": "Rename the class `Inventory` to `Stockroom` and the method `add_item` "
        "to `put` everywhere in this code. Reply with the complete updated code only.\n\n```python\n" + _CODE + "```",
    },
    {"task": "summarize", "prompt": "Summarize this news article in three sentences, keeping the numbers:\n\n" + _DOC},
    {
        "task": "summarize-2",
        "prompt": "Summarize this incident report for the engineering team as a short "
        "paragraph followed by the list of actions:\n\n" + _INCIDENT,
    },
    {
        "task": "chat",
        "prompt": "I am planning a weekend trip to the mountains in autumn. "
        "What should I pack, and what should I watch out for?",
    },
    {"task": "chat-2", "prompt": "What are the pros and cons of working from home? Give a balanced view."},
    {"task": "short-haiku", "prompt": "Write a haiku about the sea."},
    {"task": "short-fact", "prompt": "What is the capital of Australia?"},
    {
        "task": "write-code",
        "prompt": "Write a Python function that parses a CSV file of transactions "
        "(date, description, amount) and returns the total amount per month, with a docstring and type hints.",
    },
    STRUCTURED_PROMPT,
    FIM_PROMPTS[3],  # an editor's autocomplete (fim-incr: the longest middle)
]
