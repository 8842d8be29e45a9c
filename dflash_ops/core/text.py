"""Text from files and hosts, kept inert wherever it is shown or written.

A prompt id, a training-run or prompt-set name, a tag or a log line comes from a results
file or a host, and can hold anything: an escape sequence that clears the screen or sets
the terminal's title, a bidi override that makes a name read backwards, a newline that
fakes a table row, a spreadsheet formula. Every view shows such text through `inert`
(control characters escaped, visibly: `\\x1b`, never dropped), and every CSV cell goes
through `csv_cell` (OWASP's rule against formula injection). Tags, the one free text a user
gives that travels with a run, are checked by `check_tag` at `--tag` and when read back.
"""

from __future__ import annotations

import re
from typing import Any

from dflash_ops.core.errors import OpsError

# DEL, the C1 controls, and the bidi embeddings, overrides and isolates; with the C0 controls
# (all of them, or all but tab and newline where the text's layout is its lines).
_BEYOND_C0 = "\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
_UNSAFE_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_BEYOND_C0}]")
MAX_TAG = 64  # a label, not a document: it is part of every run id that carries it
# A spreadsheet reads a text cell that starts so as a formula (OWASP: CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}  # as Python writes them; the rest by number


def _escaped(match: re.Match[str]) -> str:
    character = match.group()
    code = ord(character)
    if character in _SHORT:
        return _SHORT[character]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def inert(text: str, *, lines: bool = False) -> str:
    """`text` with every control character escaped (`\\x1b`, `\\u202e`, `\\n`): nothing in it can
    move the cursor, restyle or retitle the terminal, or reorder what follows. `lines`:
    newline and tab are kept, for text whose layout is its lines (a log, a summary)."""
    pattern = _UNSAFE_IN_LINES if lines else _UNSAFE
    return pattern.sub(_escaped, text)


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell: a text that a spreadsheet would run as a formula gets a leading
    single quote (shown as text), and its control characters are escaped but for newline
    and tab (quoted by the writer); numbers, and text that reads as one ('-1.5'), stay as
    they are."""
    if not isinstance(value, str):
        return value
    if value.startswith(_FORMULA_STARTS) and not _NUMBER.fullmatch(value):
        value = "'" + value
    return inert(value, lines=True)


def tag_problem(tag: str) -> str | None:
    """What makes `tag` no tag (None: it is one): printable text of 1 to MAX_TAG
    characters."""
    if not tag:
        return "an empty text"
    if len(tag) > MAX_TAG:
        return f"{len(tag)} characters, more than {MAX_TAG}"
    if not tag.isprintable() or _UNSAFE.search(tag):
        return f"'{inert(tag)}', which holds characters that are not printable"
    return None


def check_tag(tag: str | None, flag: str = "--tag") -> str | None:
    """`tag` when it is a tag (None stays None); else an OpsError naming `flag`."""
    if tag is None:
        return None
    problem = tag_problem(tag)
    if problem is not None:
        raise OpsError(
            f"{flag}: expected printable text of 1 to {MAX_TAG} characters, found {problem}"
        )
    return tag
