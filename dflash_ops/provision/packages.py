"""What the eval venv should contain (the requirement strings) and where uv takes it from.

CPU torch never replaces PyPI: indexes are only ever *extra* (`--extra-index-url`), and online
the CPU build comes from uv's torch backend. Where the inventory names no sources, the
workstation pip's *local* ones (find-links directories, file:// indexes) are used when the
host sees them too: uv does not read pip's settings itself.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import urlparse

from dflash_ops.core.inventory import VenvSpec
from dflash_ops.remote.connection import Host

BASE_PACKAGES = ("torch", "transformers", "safetensors", "requests")
# The harness is tested on this range (qwen3_5 configs, text-only loading of the VL wrapper by
# key mapping); the inventory's venv.versions overrides it. The harness still checks on load
# that the weights came in the dtype the results record.
TESTED_VERSIONS = {"transformers": ">=5.17,<6"}

# The fields of VenvSpec that decide what the venv contains (uv_dir, cache_dir and min_free
# only decide how it is built): a change in these makes a rerun upgrade.
SPEC_FIELDS = (
    "python",
    "torch",
    "versions",
    "packages",
    "find_links",
    "extra_index_url",
    "offline",
    "wheelhouse",
)


def requirements(spec: VenvSpec) -> list[str]:
    """The requirement strings for uv/pip: the base packages and `packages`, with the
    inventory's `versions` ("1.2" pins with ==, a specifier is kept as written)."""
    reqs = []
    for requirement in [*BASE_PACKAGES, *spec.packages]:
        name = requirement_name(requirement)
        version = spec.versions.get(name, TESTED_VERSIONS.get(name))
        if version is None:
            reqs.append(requirement)
        elif version[:1] in "<>=!~":
            reqs.append(f"{name}{version}")
        else:
            reqs.append(f"{name}=={version}")
    return reqs


# Packages whose build imports torch (causal-conv1d ships only a source archive, whose setup
# fetches or compiles the CUDA extension for the installed torch): installed after the rest,
# without build isolation, so that the build sees the venv's torch.
BUILT_AGAINST_TORCH = ("causal-conv1d",)


def split_built_against_torch(reqs: list[str]) -> tuple[list[str], list[str]]:
    """(the requirements installed first, those built against the venv's torch after)."""
    later = [r for r in reqs if normalize(requirement_name(r)) in BUILT_AGAINST_TORCH]
    return [r for r in reqs if r not in later], later


def requirement_name(requirement: str) -> str:
    for index, char in enumerate(requirement):
        if not (char.isalnum() or char in "-_."):
            return requirement[:index]
    return requirement


def normalize(name: str) -> str:
    """PEP 503 name normalization (dist-info directories use underscores)."""
    return "-".join(part for part in name.lower().replace("_", "-").replace(".", "-").split("-"))


def requested(spec: VenvSpec) -> dict:
    """The part of the spec recorded on the host and compared on a rerun."""
    dumped = spec.model_dump(mode="json")
    return {key: dumped[key] for key in SPEC_FIELDS}


@dataclass(frozen=True)
class Sources:
    """Where uv takes packages from, and why (for the messages and the record)."""

    find_links: tuple[str, ...] = ()
    extra_index_url: tuple[str, ...] = ()
    offline: bool = False
    best_match: bool = False  # pip's rule (best version across indexes), for pip's sources
    no_index: bool = False  # wheelhouse: only find_links
    origin: str = "inventory"

    def uv_args(self, spec: VenvSpec) -> list[str]:
        args: list[str] = []
        for link in self.find_links:
            args += ["--find-links", link]
        if self.no_index:
            return [*args, "--no-index", "--offline"]
        for url in self.extra_index_url:
            args += ["--extra-index-url", url]
        if self.best_match and self.extra_index_url:
            args += ["--index-strategy", "unsafe-best-match"]
        if self.offline:
            args.append("--offline")
        elif spec.torch == "cpu":
            # CPU torch from the PyTorch index for torch only; PyPI stays the index for the rest.
            args += ["--torch-backend", "cpu"]
        return args

    def describe(self) -> str:
        parts = [f"find-links {', '.join(self.find_links)}"] if self.find_links else []
        if self.no_index:
            parts.append("no index")
        elif self.extra_index_url:
            parts.append(f"extra indexes {', '.join(self.extra_index_url)}")
        if self.offline and not self.no_index:
            parts.append("offline")
        return f"{'; '.join(parts) or 'PyPI'} ({self.origin})"

    def record(self) -> dict:
        """What the provision record keeps of them."""
        return {
            "find_links": list(self.find_links),
            "extra_index_url": list(self.extra_index_url),
            "offline": self.offline,
            "no_index": self.no_index,
            "origin": self.origin,
        }


def workstation_pip_sources() -> tuple[list[str], list[str]]:
    """Local find-links and file:// extra indexes from the workstation's pip: $PIP_FIND_LINKS
    first, then `pip config`. Only local ones: those are what a lab (or a host sharing the
    filesystem) can use, and uv does not read pip's settings itself."""
    find_links = os.environ.get("PIP_FIND_LINKS", "").split()
    indexes = os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values = value.strip().strip("'\"").split()
        if key.endswith(".find-links"):
            find_links += values
        elif key.endswith(".extra-index-url"):
            indexes += values
    local_links = [link for link in find_links if _local_path(link)]
    local_indexes = [url for url in indexes if url.startswith("file://")]
    return list(dict.fromkeys(local_links)), list(dict.fromkeys(local_indexes))


def _local_path(location: str) -> str | None:
    if location.startswith("file://"):
        return urlparse(location).path
    if location.startswith("/"):
        return location
    return None


def resolve_sources(host: Host, spec: VenvSpec) -> Sources:
    """The inventory's sources; where it sets none, the workstation pip's local ones that
    exist on the host too."""
    if spec.find_links is not None and spec.extra_index_url is not None:
        return Sources(tuple(spec.find_links), tuple(spec.extra_index_url), spec.offline)
    pip_links, pip_indexes = workstation_pip_sources()
    present = _present_on(host, pip_links + pip_indexes)
    find_links = (
        spec.find_links
        if spec.find_links is not None
        else [link for link in pip_links if link in present]
    )
    indexes = (
        spec.extra_index_url
        if spec.extra_index_url is not None
        else [url for url in pip_indexes if url in present]
    )
    from_pip = (spec.find_links is None and find_links) or (
        spec.extra_index_url is None and indexes
    )
    return Sources(
        tuple(find_links),
        tuple(indexes),
        spec.offline,
        best_match=spec.extra_index_url is None and bool(indexes),
        origin="inventory + workstation pip config" if from_pip else "inventory",
    )


def _present_on(host: Host, locations: list[str]) -> set[str]:
    """The local locations (directories, file:// URLs) that exist on the host too."""
    candidates = {
        location: path for location in locations if (path := _local_path(location)) is not None
    }
    if not candidates:
        return set()
    lines = host.run(
        "; ".join(
            f"[ -e {shlex.quote(path)} ] && echo {shlex.quote(location)}"
            for location, path in candidates.items()
        )
        + "; true"
    ).stdout.splitlines()
    return {line.strip() for line in lines}
