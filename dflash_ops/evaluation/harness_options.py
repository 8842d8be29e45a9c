"""The harness options `fab run-eval` passes through, under the harness's own names.

Each entry: run-eval's option (the task's keyword) → the harness flag and how its value is
checked on the workstation, so a bad value fails before anything is staged or launched.
Options that run-eval manages itself (--checkpoint, --target, --out, --step, --cache-dir,
--prompts, --reference-drafter, --sglang-url, --drafter-config, --drafter-profile) are not
here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from dflash_eval.dtypes import dtype_name

from dflash_ops.core.arguments import parse_count, parse_number
from dflash_ops.core.errors import OpsError

# (flag, value) → the value checked: an int, a str or True (a switch); None when unset.
Check = Callable[[str, object], "int | str | bool | None"]


def count(minimum: int) -> Check:
    def check(flag: str, value: object) -> int | None:
        return parse_count(flag, value, minimum)  # type: ignore[arg-type]

    return check


def number(low: float, high: float, low_open: bool = False) -> Check:
    """A finite real number in [low, high] ((low, high] when low_open), kept as the text
    given; parsed by the one number parser (core.arguments), bounded here for the open end."""

    def check(flag: str, value: object) -> str | None:
        if value in (None, ""):
            return None
        try:
            found = parse_number(flag, value)
        except OpsError:
            found = math.nan  # not a finite number: the bounds below name what is expected
        if not (low < found if low_open else low <= found) or not found <= high:
            closing = ")" if math.isinf(high) else "]"
            bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{closing}"
            raise OpsError(f"{flag}: expected a number in {bounds}, found {value!r}")
        return str(value)

    return check


def text(flag: str, value: object) -> str | None:
    return None if value in (None, "") else str(value)


def choice(*allowed: str) -> Check:
    def check(flag: str, value: object) -> str | None:
        if value in (None, ""):
            return None
        if value not in allowed:
            raise OpsError(f"{flag}: expected one of {', '.join(allowed)}, found {value!r}")
        return str(value)

    return check


def dtype_choice(*allowed: str) -> Check:
    """A dtype flag: aliases (bf16, fp32…) normalised as the harness does, then checked."""
    check_name = choice(*allowed)

    def check(flag: str, value: object) -> str | None:
        return check_name(flag, None if value in (None, "") else dtype_name(str(value)))

    return check


def switch(flag: str, value: object) -> bool | None:
    return True if value else None


DTYPES = ("float32", "bfloat16")

OPTIONS: dict[str, tuple[str, Check]] = {
    "num_prompts": ("--num-prompts", count(1)),
    "max_new_tokens": ("--max-new-tokens", count(1)),
    "max_blocks": ("--max-blocks", count(1)),
    "block_size": ("--block-size", count(2)),
    "ddtree": ("--ddtree", text),
    "threads": ("--threads", count(1)),
    "mask_token_id": ("--mask-token-id", count(0)),
    "target_layer_ids": ("--target-layer-ids", text),
    "accept_default": ("--accept-default", text),
    "dtype": ("--dtype", dtype_choice(*DTYPES)),
    "target_dtype": ("--target-dtype", dtype_choice("auto", *DTYPES)),
    "safe_globals": ("--safe-globals", text),
    "allow_unsafe_pickle": ("--allow-unsafe-pickle", switch),
    "no_cache": ("--no-cache", switch),
    "chunk_anchors": ("--chunk-anchors", count(1)),
    "per_block": ("--per-block", switch),
    "thinking": ("--thinking", choice("on", "off")),
    "verify": ("--verify", switch),
    "temperature": ("--temperature", number(0, float("inf"))),
    "top_p": ("--top-p", number(0, 1, low_open=True)),
    "top_k": ("--top-k", count(0)),
    "seed": ("--seed", count(0)),
    "samples": ("--samples", count(2)),
}


def pick(values: Mapping[str, object], names: Iterable[str] = OPTIONS) -> dict[str, object]:
    """The harness options among a task's keyword values (`fab run-eval`'s and `fab watch`'s
    share them: one list, here); `names`: only these (a task that takes a few of them)."""
    return {name: values[name] for name in names if name in values}


def checked(values: Mapping[str, object]) -> dict[str, int | str | bool]:
    """run-eval's option values, each checked as run-eval checks it (a bad one fails naming
    its flag); unset ones are left out."""
    unknown = set(values) - set(OPTIONS)
    if unknown:
        raise OpsError(f"not harness options: {', '.join(sorted(unknown))}")
    found = {}
    for name, value in values.items():
        flag, check = OPTIONS[name]
        parsed = check(flag, value)
        if parsed is not None:
            found[name] = parsed
    return found


def harness_args(values: Mapping[str, object]) -> list[str]:
    """The harness argv for run-eval's option values (unset ones keep the harness's default)."""
    args: list[str] = []
    for name, value in checked(values).items():
        flag = OPTIONS[name][0]
        args += [flag] if value is True else [flag, str(value)]
    return args
