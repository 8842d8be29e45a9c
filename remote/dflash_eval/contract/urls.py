"""URLs given to the harness (SGLang's): shown without secrets, read from a file on request.

Stdlib only, so the CLI can use it before anything heavy is imported.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dflash_eval.contract.errors import HarnessError


def redact_url(url: str) -> str:
    """`url` as messages, logs, results and cache keys may show it: its scheme, host and
    port only. Everything else (user, password, path, query, fragment) may carry a token, so
    none of it is shown; `/***` marks that something was left out."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # not a port: not shown either
        port = None
    shown = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    hidden = parts.username or parts.password or parts.path.strip("/") or parts.query
    return f"{shown}/***" if hidden or parts.fragment else shown


def conceal(text: str, url: str) -> str:
    """`text` (a server's answer quoted in a message) with each part of `url` that
    `redact_url` hides replaced by `***`: a proxy's error page may echo the path."""
    parts = urlsplit(url.strip())
    hidden = (parts.username, parts.password, parts.path.strip("/"), parts.query, parts.fragment)
    for secret in sorted(filter(None, hidden), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def endpoint(url: str, name: str) -> str:
    """The URL of endpoint `name` under the base `url`: joined to its path (a proxy's
    prefix stays), its query string kept, its fragment dropped."""
    parts = urlsplit(url.strip())
    path = f"{parts.path.rstrip('/')}/{name}"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def read_url(value: str) -> str:
    """--sglang-url's value: the URL itself, or `@FILE` to read it from a file (so that a URL
    with credentials stays out of argv, `ps` and the run's recorded command)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text().strip()
    except OSError as error:
        raise HarnessError(f"--sglang-url {value}: cannot read the URL file ({error}).") from None
