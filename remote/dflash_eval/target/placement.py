"""Where each part of a sharded target lives: the decoder split over several GPUs.

A 27B target in bf16 (~55 GB) does not fit one 48 GB card, so a features host may shard it
over every GPU it sees (`CUDA_VISIBLE_DEVICES` names them; the workstation sets it from the
inventory's `gpus`), with at most `--gpu-memory` bytes of weights on each. The plan is the
project's own, made before anything loads: the embedding first, the decoder layers in order,
the final norm and LM head last, each device filled to an equal share of the weights (never
past the cap), so the forward passes through the devices once, in order. transformers loads
each weight straight onto its device from that `device_map` (through accelerate, which also
moves the activations from one device to the next).

The plan depends only on the module sizes, the devices and the cap, so it is tested on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dflash_eval.contract.errors import HarnessError


@dataclass(frozen=True)
class Shard:
    """Asked for: split the target over these devices, at most `cap_bytes` of weights each."""

    devices: tuple[str, ...]
    cap_bytes: int | None = None


@dataclass(frozen=True)
class Unit:
    """Modules that go to one device together, in forward order."""

    modules: tuple[str, ...]
    bytes: int
    layer: int | None = None  # the decoder layer it is (None: embedding or head)


@dataclass(frozen=True)
class Placement:
    devices: tuple[str, ...]
    device_map: dict[str, str]  # module name → device
    weight_bytes: dict[str, int]  # device → bytes of weights placed there
    layers: dict[str, list[int]]  # device → its decoder layers (first, last)
    cap_bytes: int | None

    def record(self) -> dict[str, Any]:
        """What the results say about the sharding."""
        return {
            "devices": list(self.devices),
            "layers": self.layers,
            "weight_bytes": self.weight_bytes,
            "cap_bytes": self.cap_bytes,
        }


def _bytes(module: nn.Module, element_bytes: int) -> int:
    return sum(p.numel() for p in module.parameters()) * element_bytes


def units_of(model: nn.Module, decoder_name: str, element_bytes: int, tied: bool) -> list[Unit]:
    """The model cut into units in forward order: the embedding (with the LM head when it is
    tied to it, and the weightless rotary table the decoder runs before its layers), each
    decoder layer, then everything else (final norm, LM head)."""
    decoder = model.get_submodule(decoder_name)
    prefix = f"{decoder_name}." if decoder_name else ""
    first = [f"{prefix}embed_tokens"]
    last: list[str] = []
    for name, child in decoder.named_children():
        if name not in ("embed_tokens", "layers"):
            weightless = next(child.parameters(), None) is None
            (first if weightless else last).append(prefix + name)
    root = decoder_name.split(".")[0] if decoder_name else None
    for name, _ in model.named_children():
        if name != root:
            (first if tied and name == "lm_head" else last).append(name)
    units = [Unit(tuple(first), sum(_bytes(model.get_submodule(m), element_bytes) for m in first))]
    for index, layer in enumerate(decoder.layers):
        units.append(Unit((f"{prefix}layers.{index}",), _bytes(layer, element_bytes), index))
    units.append(
        Unit(tuple(last), sum(_bytes(model.get_submodule(m), element_bytes) for m in last))
    )
    return units


def plan(units: list[Unit], devices: list[str], cap_bytes: int | None) -> Placement:
    """Each device gets about an equal share of the weights, in order; when that would put
    some device past the cap, devices are filled up to the cap instead. Refused (naming the
    sizes and what to do) when the weights do not fit under the caps at all."""
    if not devices:
        raise HarnessError("No device to place the target on: torch sees no GPU here.")
    total = sum(unit.bytes for unit in units)
    balanced = _fill(units, len(devices), total / len(devices), midpoint=True)
    attempts = (
        [balanced] if cap_bytes is None else [balanced, _fill(units, len(devices), cap_bytes)]
    )
    for assigned in attempts:
        placement = _placement(units, devices, assigned, cap_bytes)
        if cap_bytes is None or max(placement.weight_bytes.values()) <= cap_bytes:
            return placement
    largest = max(unit.bytes for unit in units)
    raise HarnessError(
        f"The target's weights ({total / 2**30:.2f} GiB, largest part {largest / 2**30:.2f} "
        f"GiB) do not fit {len(devices)} GPU(s) at {cap_bytes / 2**30:.2f} GiB each. Add GPUs "
        "to the features host's `gpus` or raise its `gpu_memory` (or, in float32, pass "
        "--target-dtype bfloat16)."
    )


def _fill(units: list[Unit], count: int, limit: float, midpoint: bool = False) -> list[int]:
    """The device index of each unit, in order: the next device starts when the unit would
    pass `limit` (with `midpoint`: when its middle would, which evens out the shares); the
    last device takes the rest."""
    assigned, device, used = [], 0, 0
    for unit in units:
        reach = used + (unit.bytes / 2 if midpoint else unit.bytes)
        if used and reach > limit and device < count - 1:
            device, used = device + 1, 0
        assigned.append(device)
        used += unit.bytes
    return assigned


def _placement(
    units: list[Unit], devices: list[str], assigned: list[int], cap: int | None
) -> Placement:
    device_map: dict[str, str] = {}
    weight_bytes = {device: 0 for device in devices}
    layers: dict[str, list[int]] = {}
    for unit, index in zip(units, assigned, strict=True):
        device = devices[index]
        weight_bytes[device] += unit.bytes
        for module in unit.modules:
            device_map[module] = device
        if unit.layer is not None:
            span = layers.setdefault(device, [unit.layer, unit.layer])
            span[1] = unit.layer
    return Placement(tuple(devices), device_map, weight_bytes, layers, cap)


def require_placed(model: nn.Module, placement: Placement, path: object) -> None:
    """Every weight is on the device the plan gave its module (what the results record)."""
    for name, parameter in model.named_parameters():
        planned = _planned_device(placement.device_map, name)
        if planned is None or parameter.device != torch.device(planned):
            raise HarnessError(
                f"Target {path}: weight {name} loaded on {parameter.device}, but the placement "
                f"plan puts it on {planned}. The results would misstate where the target ran; "
                "check the accelerate and transformers versions in the features venv."
            )


def _planned_device(device_map: dict[str, str], name: str) -> str | None:
    """The device of the longest module name in the map that contains `name`."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        found = device_map.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None
