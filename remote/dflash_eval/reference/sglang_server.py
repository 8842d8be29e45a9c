"""Which SGLang server a run's completions come from, and whether it serves the run's target.

`--completions` chooses: `sglang` (the server of --sglang-url; the default when one is given)
or `local` (the target decodes here). Before a server's completion is used, the server is asked
what it serves: SGLang's native `GET /get_model_info` answers `model_path` (the path or Hugging
Face id given to `--model-path`), `GET /get_server_info` its `version` among the server's
arguments. A server serving another model would make every reference wrong, so the run stops
with one line naming both. Only the model path and the version are kept: the rest of
/get_server_info holds the server's arguments, an API key among them.

Names are compared, not paths: the server's path is often another machine's or a hub id
(`Qwen/Qwen3.6-27B`), so the last component of each side is compared, case aside; a Hugging
Face cache snapshot (`models--Qwen--Qwen3.6-27B/snapshots/<hash>`) is named by its repository.

Stdlib only at import (requests is imported when a server is asked), so the CLI can use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.urls import conceal, endpoint, redact_url

INFO_TIMEOUT_S = 30.0  # the info endpoints answer at once; a server that does not is down


def completions_url(completions: str | None, sglang_url: str | None) -> str | None:
    """The SGLang URL a run uses: None for local completions. `completions` None: SGLang
    when a URL is given."""
    if completions == "local":
        return None
    if completions == "sglang" and not sglang_url:
        raise HarnessError(
            "--completions sglang needs --sglang-url (the server's URL, or @FILE holding it); "
            "or pass --completions local to decode the completions with the target here."
        )
    return sglang_url


@dataclass(frozen=True)
class ServedModel:
    """What a server says it serves."""

    model_path: str
    version: str | None  # None: the server does not say

    def record(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "version": self.version}


def model_name(path: str) -> str:
    """The name a model path or hub id stands for (module docstring), in lower case."""
    parts = PurePosixPath(path.strip().rstrip("/")).parts
    for part in reversed(parts):
        if part.startswith("models--"):  # a hub cache: models--ORG--NAME/snapshots/HASH
            return part.rsplit("--", 1)[-1].lower()
    return parts[-1].lower() if parts else ""


def target_names(target: Path) -> set[str]:
    """The names the target directory goes by: its own, the one it resolves to, and the
    `_name_or_path` its config may carry."""
    names = {model_name(str(target)), model_name(str(Path(target).resolve()))}
    try:
        config = json.loads((Path(target) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    recorded = config.get("_name_or_path") if isinstance(config, dict) else None
    if isinstance(recorded, str) and recorded.strip():
        names.add(model_name(recorded))
    return names - {""}


def ask(url: str, timeout_s: float = INFO_TIMEOUT_S) -> ServedModel:
    """The server's model and version; HarnessError when it cannot say which model."""
    info = _get_json(url, "get_model_info", timeout_s)
    model_path = info.get("model_path") if isinstance(info, dict) else None
    if not isinstance(model_path, str) or not model_path.strip():
        raise HarnessError(
            f"SGLang's /get_model_info at {redact_url(url)} names no model_path, so the model "
            "it serves cannot be checked. Point --sglang-url at SGLang itself, or pass "
            "--completions local."
        )
    try:
        version = _get_json(url, "get_server_info", timeout_s).get("version")
    except (HarnessError, AttributeError):  # an older server: the model is what matters
        version = None
    return ServedModel(model_path.strip(), version if isinstance(version, str) else None)


def check_serves(url: str, target: Path, timeout_s: float = INFO_TIMEOUT_S) -> ServedModel:
    """The server's model, when it is the target; HarnessError naming both otherwise."""
    served = ask(url, timeout_s)
    if model_name(served.model_path) not in target_names(target):
        raise HarnessError(
            f"SGLang at {redact_url(url)} serves {served.model_path}, but the target is "
            f"{target}: its completions would be another model's. Start SGLang with "
            "--model-path for this target, point sglang_url at a server that serves it, or "
            "pass --completions local."
        )
    return served


def _get_json(url: str, name: str, timeout_s: float) -> Any:
    import requests

    shown = redact_url(url)
    try:
        response = requests.get(endpoint(url, name), timeout=timeout_s)
    except requests.RequestException as error:
        raise HarnessError(
            f"Cannot reach the SGLang server at {shown} ({type(error).__name__}). Start it on "
            "the eval host (python -m sglang.launch_server --model-path <target>), check "
            "sglang_url, or pass --completions local to decode the completions here."
        ) from None
    if response.status_code != 200:
        raise HarnessError(
            f"SGLang's /{name} at {shown} answered HTTP {response.status_code}: "
            f"{conceal(response.text[:200], url)}. Point --sglang-url at SGLang itself (its "
            "native endpoints), or pass --completions local."
        )
    try:
        return response.json()
    except ValueError:
        raise HarnessError(
            f"SGLang's /{name} at {shown} did not answer JSON (got "
            f"{conceal(response.text[:200], url)!r}); check that the URL points at SGLang."
        ) from None
