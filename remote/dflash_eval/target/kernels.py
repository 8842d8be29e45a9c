"""Which kernels a target's forward really ran, seen while it runs.

transformers picks the linear-attention kernels of a Qwen3.5/3.6 layer when it is imported:
`fla`'s gated delta rule and `causal_conv1d`'s convolution when those import, else its own
torch code, and it falls back silently when an installed package fails to import (no GPU, a
triton mismatch). Whether `fla` is installed is therefore only a guess at what ran. This
module watches one forward instead: a profile hook notes every call into `fla` or
`causal_conv1d`, and every call of transformers' torch fallbacks, under the decoder layer
that made it. The record names, per kind of kernel, what each linear-attention layer ran.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.contract.errors import HarnessError

if TYPE_CHECKING:
    from torch import nn

TORCH_FALLBACK = "torch fallback"
LINEAR_ATTENTION, CONV1D = "linear_attention", "conv1d"
# The packages whose code runs a kind of kernel: kind → (import name, distribution).
PACKAGES = {
    LINEAR_ATTENTION: ("fla", "flash-linear-attention"),
    CONV1D: ("causal_conv1d", "causal-conv1d"),
}
# transformers' own torch code for each kind (function names in its modeling files).
FALLBACKS = {
    LINEAR_ATTENTION: ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
    CONV1D: ("causal_conv1d_fn", "causal_conv1d_update"),
}


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    return str(Path(file).parent) if file else None


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


class KernelWatch:
    """Notes, per decoder layer, which implementation of each kernel kind ran."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.layers = layers
        self.seen: dict[str, dict[int, set[str]]] = {kind: {} for kind in PACKAGES}
        self._layer: int | None = None
        self._dirs = {kind: _package_dir(name) for kind, (name, _) in PACKAGES.items()}

    def _note(self, frame: Any, event: str, _arg: Any) -> None:
        if event != "call" or self._layer is None:
            return
        code = frame.f_code
        for kind, directory in self._dirs.items():
            if directory and code.co_filename.startswith(directory):
                distribution = PACKAGES[kind][1]
                self.seen[kind].setdefault(self._layer, set()).add(
                    f"{distribution} {_version(distribution)}"
                )
            elif code.co_name in FALLBACKS[kind] and "transformers" in code.co_filename:
                self.seen[kind].setdefault(self._layer, set()).add(TORCH_FALLBACK)

    def _enter(self, index: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            self._layer = index

        return hook

    def run(self, forward: Callable[[], Any]) -> Any:
        """`forward()` under watch (the hook costs a few Python calls per call it sees)."""
        self._dirs = {kind: _package_dir(name) for kind, (name, _) in PACKAGES.items()}
        handles = [
            layer.register_forward_pre_hook(self._enter(index))
            for index, layer in enumerate(self.layers)
        ]
        previous = sys.getprofile()
        sys.setprofile(self._note)
        try:
            return forward()
        finally:
            sys.setprofile(previous)
            self._layer = None
            for handle in handles:
                handle.remove()

    def record(self, linear_layers: list[int]) -> dict[str, Any]:
        """Per kind: the implementation every linear-attention layer ran (one name), or the
        layers of each when they differ; `not seen` for layers where nothing was noticed."""
        kinds: dict[str, Any] = {}
        for kind, by_layer in self.seen.items():
            used: dict[str, list[int]] = {}
            for layer in linear_layers:
                names = sorted(by_layer.get(layer, ())) or ["not seen"]
                for name in names:
                    used.setdefault(name, []).append(layer)
            if used:
                kinds[kind] = next(iter(used)) if len(used) == 1 else used
        return kinds


def expected(kind: str) -> str:
    """What transformers should pick for `kind`, from what is installed (before any run; the
    cache key needs it): the package's name and version, else the torch fallback."""
    name, distribution = PACKAGES[kind]
    if importlib.util.find_spec(name) is None:
        return TORCH_FALLBACK
    return f"{distribution} {_version(distribution)}"


def require_as_expected(expected_kernels: dict[str, str], ran: dict[str, Any]) -> None:
    """The kernels the forward ran are the ones the cache key and the run's plan assumed;
    otherwise the features would be filed and reported under kernels that did not compute
    them."""
    differ = {
        kind: (expected_kernels.get(kind), ran.get(kind))
        for kind in {*expected_kernels, *ran}
        if expected_kernels.get(kind) != ran.get(kind)
    }
    if differ:
        shown = "; ".join(
            f"{kind}: expected {want}, ran {got}" for kind, (want, got) in sorted(differ.items())
        )
        raise HarnessError(
            f"The target's forward did not run the kernels installed on this host ({shown}). "
            "An installed kernel package that fails to import makes transformers fall back "
            "silently: check that `python -c 'import fla, causal_conv1d'` works in this venv "
            "(a GPU build of torch, a matching triton), or uninstall the package."
        )
