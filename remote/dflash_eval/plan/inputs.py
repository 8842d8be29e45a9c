"""`plan --inputs-on-stdin`: the files a real run would upload, sent on stdin instead, so
that a plan needs nothing written on the host first."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError

STDIN_FILES = ("prompts", "drafter_config", "drafter_profile")
MEMORY_FILE_PREFIX = "/proc/self/fd/"
_open_memory_files: list[int] = []  # kept open: their /proc paths live as long as the fds


def stdin_inputs(text: str) -> dict[str, Any]:
    """`--inputs-on-stdin`: file contents (and the SGLang URL) sent on stdin, so that a plan
    needs nothing uploaded. Each file becomes an anonymous in-memory file (memfd) read
    through its /proc/self/fd path: the code that reads paths reads it unchanged, and
    nothing lands on a filesystem."""
    try:
        given = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        raise HarnessError(f"--inputs-on-stdin: stdin is not JSON ({error}).") from None
    unknown = sorted(set(given) - {*STDIN_FILES, "sglang_url"}) if isinstance(given, dict) else []
    if not isinstance(given, dict) or unknown:
        raise HarnessError(
            f"--inputs-on-stdin: expected a JSON object with keys among {STDIN_FILES} and "
            f"sglang_url, found {unknown or type(given).__name__}."
        )
    inputs: dict[str, Any] = {}
    for name in STDIN_FILES:
        if given.get(name) is not None:
            inputs[name] = memory_file(name, str(given[name]))
    if given.get("sglang_url"):
        inputs["sglang_url"] = str(given["sglang_url"])
    return inputs


def memory_file(name: str, content: str) -> Path:
    descriptor = os.memfd_create(name)
    os.write(descriptor, content.encode())
    _open_memory_files.append(descriptor)
    return Path(f"{MEMORY_FILE_PREFIX}{descriptor}")


def is_memory_file(path: Path) -> bool:
    return str(path).startswith(MEMORY_FILE_PREFIX)
