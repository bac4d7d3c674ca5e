"""`ITEMS`: every reproduction item, in the summary table's order (`ORDER`), the one registry
the driver (experiments/reproduce.py) and the reports read. Each item is declared once, in
`experiments/items_paper.py` (the papers' tables and figures), `experiments/items_recipe.py` or
`experiments/items_oracle.py` (the issues' questions); what an item is, is
`experiments/items.py`."""

from __future__ import annotations

from experiments import items_oracle, items_paper, items_recipe
from experiments.items import declare

ITEMS = declare(*items_paper.PAPER_ITEMS, *items_recipe.RECIPE_ITEMS,
                *items_oracle.ORACLE_ITEMS)


def __getattr__(name: str):
    if name == "ORDER":  # the declaration order (a test's toy item added to ITEMS included)
        return tuple(ITEMS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
