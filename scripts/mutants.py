"""Mutants for the mutation check (mutation.py): the small AST changes one module admits,
each identified by its function and the text it changes, and the source with one applied."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A module to mutate and the fast tests that own it (pytest arguments)."""

    name: str
    path: str
    tests: tuple[str, ...]
    scopes: tuple[str, ...] = ()  # qualnames (functions, classes) to mutate; () = all


FLIPPED = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
DROPPABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.Raise, ast.If, ast.Continue, ast.Break)
# Fields that hold types or documentation, never behaviour.
SKIPPED_FIELDS = {"annotation", "returns", "decorator_list", "type_comment"}


@dataclass
class Site:
    """One possible change: where it is, and a function that makes it on its tree."""

    qualname: str
    line: int
    statement: ast.stmt  # whose text identifies the change
    apply: Callable[[], None]
    dropped: bool = False  # the change removes `statement`


def _is_inert(statement: ast.stmt) -> bool:
    """A docstring or `...`: a constant as a statement, nothing to drop."""
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _expression_sites(node: ast.AST) -> Iterator[Callable[[], None]]:
    """The changes that can be made to one expression node, in place."""
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            flipped = FLIPPED.get(type(op))
            if flipped is not None:

                def flip(i: int = index, new: type = flipped) -> None:
                    node.ops[i] = new()

                yield flip
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield lambda: setattr(node, "op", other())
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        # `not x` → `not not x`: the negation dropped, the value still a bool.
        yield lambda: setattr(node, "operand", ast.UnaryOp(ast.Not(), node.operand))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        if not any(_is_text(side) for side in (node.left, node.right)):
            other = ast.Sub if isinstance(node.op, ast.Add) else ast.Add
            yield lambda: setattr(node, "op", other())
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield lambda: setattr(node, "value", not node.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield lambda: setattr(node, "value", node.value + 1)
        yield lambda: setattr(node, "value", node.value - 1)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    )


def _return_sites(node: ast.Return) -> Iterator[Callable[[], None]]:
    value = node.value
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return
    if isinstance(value, ast.Constant) and type(value.value) is bool:
        return  # the bool flip above covers it
    yield lambda: setattr(node, "value", ast.Constant(None))


def sites(tree: ast.Module, scopes: tuple[str, ...]) -> list[Site]:
    """Every change in `tree` within `scopes`, in a fixed order (so index k names one)."""
    found: list[Site] = []

    def in_scope(qualname: str) -> bool:
        return not scopes or any(qualname == s or qualname.startswith(f"{s}.") for s in scopes)

    def visit_body(owner: ast.AST, name: str, qualname: str, droppable: bool) -> None:
        body = getattr(owner, name)
        for index, statement in enumerate(body):
            if _is_inert(statement):
                continue
            if droppable and isinstance(statement, DROPPABLE) and in_scope(qualname):

                def drop(b: list = body, i: int = index) -> None:
                    b[i] = ast.Pass()

                found.append(Site(qualname, statement.lineno, statement, drop, dropped=True))
            visit_statement(statement, qualname)

    def visit_statement(statement: ast.stmt, qualname: str) -> None:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = statement.name if qualname == "<module>" else f"{qualname}.{statement.name}"
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                for default in (*statement.args.defaults, *statement.args.kw_defaults):
                    if default is not None:
                        visit_expression(default, qualname, statement)
            # Statements directly in a class body declare fields: change them, never drop.
            droppable = not isinstance(statement, ast.ClassDef)
            visit_body(statement, "body", inner, droppable)
            return
        if isinstance(statement, ast.If) and _is_main_guard(statement):
            return
        if isinstance(statement, ast.Return) and in_scope(qualname):
            for change in _return_sites(statement):
                found.append(Site(qualname, statement.lineno, statement, change))
        for name, value in ast.iter_fields(statement):
            if name in SKIPPED_FIELDS:
                continue
            if name in ("body", "orelse", "finalbody") and isinstance(value, list):
                visit_body(statement, name, qualname, droppable=True)
            elif name == "handlers":
                for handler in value:
                    visit_body(handler, "body", qualname, droppable=True)
            elif name == "cases":
                for case in value:
                    visit_body(case, "body", qualname, droppable=True)
            elif isinstance(value, ast.AST):
                visit_expression(value, qualname, statement)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        visit_expression(item, qualname, statement)

    def visit_expression(node: ast.AST, qualname: str, statement: ast.stmt) -> None:
        if isinstance(node, ast.JoinedStr):
            return
        if in_scope(qualname):
            for change in _expression_sites(node):
                found.append(Site(qualname, node.lineno, statement, change))
        for name, child in ast.iter_fields(node):
            if name in SKIPPED_FIELDS:
                continue
            children = child if isinstance(child, list) else [child]
            for item in children:
                if isinstance(item, ast.AST):
                    visit_expression(item, qualname, statement)

    visit_body(tree, "body", "<module>", droppable=True)
    return found


def _is_main_guard(statement: ast.If) -> bool:
    return "__name__" in ast.unparse(statement.test)


def header(statement: ast.stmt) -> str:
    """A statement's text as it identifies a mutant: compound statements by their header."""
    if isinstance(statement, ast.If | ast.While):
        keyword = "if" if isinstance(statement, ast.If) else "while"
        return f"{keyword} {ast.unparse(statement.test)}:"
    if isinstance(statement, ast.For):
        return f"for {ast.unparse(statement.target)} in {ast.unparse(statement.iter)}:"
    if isinstance(statement, ast.With):
        return f"with {', '.join(ast.unparse(item) for item in statement.items)}:"
    if isinstance(statement, ast.Try):
        return "try:"
    return ast.unparse(statement)


@dataclass(frozen=True)
class Mutant:
    target: Target
    index: int  # position in sites()
    qualname: str
    line: int
    before: str
    after: str
    occurrence: int = 1  # the n-th identical change in this function

    @property
    def id(self) -> str:
        suffix = f" #{self.occurrence}" if self.occurrence > 1 else ""
        return f"{self.target.path}::{self.qualname}::{self.before} ⇒ {self.after}{suffix}"


def mutants_of(target: Target, source: str) -> list[Mutant]:
    count = len(sites(ast.parse(source), target.scopes))
    result: list[Mutant] = []
    seen: dict[tuple, int] = {}
    for index in range(count):
        tree = ast.parse(source)
        site = sites(tree, target.scopes)[index]
        before = header(site.statement)
        site.apply()
        after = "pass" if site.dropped else header(site.statement)
        key = (site.qualname, before, after)
        seen[key] = seen.get(key, 0) + 1
        result.append(Mutant(target, index, site.qualname, site.line, before, after, seen[key]))
    return result


def mutated_source(mutant: Mutant, source: str) -> str:
    tree = ast.parse(source)
    sites(tree, mutant.target.scopes)[mutant.index].apply()
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
