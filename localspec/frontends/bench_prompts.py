"""The built-in bench prompt set: writing code, editing code, summarizing a document, open chat."""

from __future__ import annotations

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

_DOC = '''The city council met on Tuesday to discuss the proposed expansion of the public library system.
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
service and the remaining two branches in next year's budget.'''

BUILTIN_PROMPTS: list[dict[str, str]] = [
    {"task": "write-code", "prompt": "Write a Python function that parses a CSV file of transactions "
     "(date, description, amount) and returns the total amount per month, with a docstring and type hints."},
    {"task": "edit-code", "prompt": "Rename the class `Inventory` to `Stockroom` and the method `add_item` "
     "to `put` everywhere in this code. Reply with the complete updated code only.\n\n```python\n"
     + _CODE + "```"},
    {"task": "summarize", "prompt": "Summarize this news article in three sentences, keeping the numbers:\n\n"
     + _DOC},
    {"task": "chat", "prompt": "I am planning a weekend trip to the mountains in autumn. "
     "What should I pack, and what should I watch out for?"},
]
