"""docs/results-schema.md's field tables, written from the types' own docstrings.

Each `<!-- schema: NAME -->` … `<!-- /schema -->` region of the page holds the table of the
TypedDict NAME (schema.py or schema_metrics.py): one row per key with its type and its
docstring. `python -m dflash_eval.contract.schema_doc PAGE` rewrites the regions; tests check that
the page is as this writes it, so a field is described in one place, its type.
"""

from __future__ import annotations

import ast
import re
import sys
import typing
from pathlib import Path

from dflash_eval.contract import schema, schema_metrics

MODULES = (schema, schema_metrics)
REGION = re.compile(r"<!-- schema: (\w+) -->\n.*?<!-- /schema -->", re.DOTALL)


def fields(name: str) -> list[tuple[str, str, str]]:
    """(key, type as written, docstring) of TypedDict `name`, its bases' keys first."""
    classes = _classes()
    node = classes[name]
    found = []
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            found += fields(base.id)
    body = node.body
    for index, statement in enumerate(body):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            following = body[index + 1] if index + 1 < len(body) else None
            doc = (
                following.value.value
                if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                else ""
            )
            found.append((statement.target.id, ast.unparse(statement.annotation), doc))
    return found


def table(name: str) -> str:
    record = _record(name)
    rows = ["| key | type | content |", "|---|---|---|"]
    for key, annotation, doc in fields(name):
        kind = f"`{annotation}`" + ("" if key in record.__required_keys__ else ", may be absent")
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(' '.join(doc.split()))} |")
    return "\n".join(rows)


def render(page: str) -> str:
    """The page with every schema region rewritten from the types."""
    return REGION.sub(lambda m: f"<!-- schema: {m[1]} -->\n{table(m[1])}\n<!-- /schema -->", page)


def documented(page: str) -> set[str]:
    return set(REGION.findall(page))


def reachable(root: object = schema.Results) -> set[str]:
    """Every TypedDict a Results holds, at any depth."""
    seen: set[str] = set()
    pending = [root]
    while pending:
        hint = pending.pop()
        if typing.is_typeddict(hint):
            if hint.__name__ in seen:
                continue
            seen.add(hint.__name__)
            pending += typing.get_type_hints(hint).values()
        pending += typing.get_args(hint)
    return seen


def _record(name: str) -> typing.Any:
    return next(getattr(m, name) for m in MODULES if hasattr(m, name))


def _classes() -> dict[str, ast.ClassDef]:
    classes = {}
    for module in MODULES:
        tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
        classes.update({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)})
    return classes


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main(argv: list[str]) -> int:
    page = Path(argv[0])
    text = page.read_text(encoding="utf-8")
    page.write_text(render(text), encoding="utf-8")
    missing = reachable() - documented(text)
    if missing:
        print(f"no region for {', '.join(sorted(missing))} in {page}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
