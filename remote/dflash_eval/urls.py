"""URLs given to the harness (SGLang's): shown without secrets, read from a file on request.

Stdlib only, so the CLI can use it before anything heavy is imported.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dflash_eval.errors import HarnessError


def redact_url(url: str) -> str:
    """`url` without what may be a secret: user/password and the query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username or parts.password:
        host = f"***@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "***" if parts.query else "", ""))


def read_url(value: str) -> str:
    """--sglang-url's value: the URL itself, or `@FILE` to read it from a file (so that a URL
    with credentials stays out of argv, `ps` and the run's recorded command)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text().strip()
    except OSError as error:
        raise HarnessError(f"--sglang-url {value}: cannot read the URL file ({error}).") from None
