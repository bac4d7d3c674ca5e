"""`--print-config`: the resolved config (after preset, overrides and the defaults a section
resolves, such as the loss's clip range), one `key = value` line per field, each with the first
sentence of its documentation (the docstring under the field, in `config.sections` or beside a
method in `ibpo_jax/methods/`)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring} of a dataclass whose fields are documented PEP 257-style
    (a string literal right after the annotated assignment), read from the class source; a
    class's own docs over its bases' (a class made at run time, `RunConfig`, has its bases')."""
    docs = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            docs.update(_own_field_docs(base))
    return {**docs, **_own_field_docs(cls)}


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(inspect.getsource(cls).lstrip())  # dedent-safe for top-level classes
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _first_sentence(text: str, limit: int = 100) -> str:
    head = re.split(r"(?<!e\.g)(?<!i\.e)\. ", text)[0].rstrip(".")
    return head if len(head) <= limit else head[:limit - 1] + "…"


def lines(section: Any, prefix: str = "") -> list[str]:
    """`key = value  # doc` for every field of `section` (a config dataclass), recursing into
    sub-sections; values as JSON."""
    out = []
    docs = field_docs(type(section))
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out += lines(value, prefix=f"{key}.")
            continue
        doc = docs.get(f.name, "")
        text = f"{key} = {json.dumps(value)}"
        out.append(f"{text:<44}  # {_first_sentence(doc)}" if doc else text)
    return out
