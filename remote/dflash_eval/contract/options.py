"""The harness's run options, each declared once: its flag, kind, default, help and check.

Everything else is derived from `OPTIONS`: the argparse flags of `eval` and `plan` (and of
`features` and `extract` for the few they share), the fields of `EvalOptions`, the range
checks a run makes, and on the workstation (dflash_ops imports this module, so it stays
stdlib only) the argv `fab run-eval` sends, the checks it makes before staging anything, and
the help of `fab run-eval`, `fab watch` and `fab extract-features`.

Adding an option is one `Option(...)` below plus the code that reads it
(docs/contributing.md, "How to add a harness option").

Kinds: `int` and `float` (finite, within `minimum` and `maximum`, counted in `unit`: every
number has both bounds, far beyond any real run, and is read by dflash_eval.contract.numbers),
`text` (one of `choices` when given), `dtype` (text whose aliases such as bf16 are first
named as the harness names them: dflash_eval.contract.dtypes), `path`, `switch` (a flag without a
value), `on-off` ("on"/"off" → a bool), `ints` and `names` (comma-separated lists; each int
within the bounds). A value that is refused is one HarnessError line naming the flag, the
range with its unit and the value found.

`tasks` names the fab tasks that take the option under its own name and pass it on as is;
options the workstation sets itself (paths it stages or uploads, the step) name none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dflash_eval.contract.config_keys import CONFIG_BOUNDS, LIMIT
from dflash_eval.contract.dtypes import dtype_name
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import parse_number, span

Kind = Literal["int", "float", "text", "dtype", "path", "switch", "on-off", "ints", "names"]

# The harness commands that describe a run: plan and diagnose take eval's flags.
RUN = ("eval", "plan", "diagnose")
RUN_EVAL, WATCH, EXTRACT_FEATURES = "run-eval", "watch", "extract-features"
DIAGNOSE = "diagnose"  # fab diagnose: the few run options a diagnosis is sized by
EVAL_TASKS = (RUN_EVAL, WATCH)  # fab watch passes run-eval's options to every run
DEFAULT_DEVICE = "cpu"  # the harness computes on CPU unless --device says otherwise


@dataclass(frozen=True)
class Option:
    name: str  # the field of EvalOptions and the keyword of the fab tasks
    kind: Kind
    help: str  # without the default: `help_text` adds it
    default: object = None
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False  # the minimum itself is refused: (minimum, maximum]
    unit: str = ""  # what a number counts, shown with its range ("tokens")
    choices: tuple[str, ...] = ()
    required: bool = False
    commands: tuple[str, ...] = RUN
    tasks: tuple[str, ...] = ()
    stored: bool = True  # False: read by the command line only, not a field of the options

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


DTYPES = ("float32", "bfloat16")
# Upper bounds far beyond any real run (a CPU evaluation of a million-token completion would
# not end), yet small enough that nothing sized by them exhausts a host.
INT64_MAX = (1 << 63) - 1  # whatever reaches torch must fit its int64
MAX_LAYER = CONFIG_BOUNDS["num_hidden_layers"][1]  # hidden_states[0] is the embeddings
MAX_BLOCK = CONFIG_BOUNDS["block_size"][1]
MAX_TOKENS = 1 << 20
MAX_PROMPTS = 100_000
MAX_STEP = 10**9
CACHE_DIR = Path.home() / ".cache" / "dflash-eval"

OPTIONS: tuple[Option, ...] = (
    Option(
        "checkpoint",
        "path",
        "training checkpoint.pt, Hugging Face DFlash dir, or extracted dir",
        required=True,
    ),
    Option(
        "target", "path", "target model directory (HF)", required=True, commands=(*RUN, "features")
    ),
    Option("drafter_config", "path", "drafter config.json, used when the checkpoint carries none"),
    Option(
        "block_size",
        "int",
        "block size B (default: the one the drafter was trained with)",
        minimum=2,
        maximum=MAX_BLOCK,
        unit="tokens",
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES),
    ),
    Option(
        "mask_token_id",
        "int",
        "the drafter's mask token id (overrides what the checkpoint says)",
        minimum=0,
        maximum=LIMIT,
        tasks=EVAL_TASKS,
    ),
    Option(
        "target_layer_ids",
        "ints",
        "target layers feeding the drafter, comma-separated, e.g. 1,9,17 (overrides the config)",
        minimum=0,
        maximum=MAX_LAYER,
        tasks=EVAL_TASKS,
    ),
    Option(
        "drafter_profile",
        "path",
        "JSON of drafter settings, parameter-name rules and pickle policy (an inventory "
        "profile, as the workstation sends it)",
    ),
    Option(
        "accept_default",
        "names",
        "confirm the default rule for these settings when nothing states them "
        "(comma-separated: target_layer_ids, rope); else refused",
        default=[],
        tasks=EVAL_TASKS,
    ),
    Option(
        "prompts",
        "path",
        "JSONL prompts (default: built-in set)",
        commands=(*RUN, "features"),
    ),
    Option(
        "num_prompts",
        "int",
        "use the first N prompts (more than exist: an error); with --dataset, draw N from each set",
        minimum=1,
        maximum=MAX_PROMPTS,
        unit="prompts",
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES, DIAGNOSE),
    ),
    Option(
        "thinking",
        "on-off",
        "enable_thinking for chat templates that have it (z-lab's benchmark: off)",
        default=False,
        commands=(*RUN, "features"),
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES),
    ),
    Option(
        "max_new_tokens",
        "int",
        "reference completion length, as z-lab's max_new_tokens",
        default=256,
        minimum=1,
        maximum=MAX_TOKENS,
        unit="tokens",
        commands=(*RUN, "features"),
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES, DIAGNOSE),
    ),
    Option(
        "max_blocks",
        "int",
        "stop each prompt's walk after this many rounds",
        minimum=1,
        maximum=MAX_TOKENS,
        unit="rounds",
        tasks=EVAL_TASKS,
    ),
    Option(
        "ddtree",
        "ints",
        "DDTree budgets, comma-separated (default 4,8,16,32, none for a DFlash-2 drafter; '' for "
        "none)",
        minimum=1,
        maximum=4096,
        unit="tokens",
        tasks=EVAL_TASKS,
    ),
    Option(
        "threads",
        "int",
        "torch CPU threads on the host that runs it (default: its physical cores less 2 "
        "for SGLang and the system; fewer kept back below 8 cores)",
        minimum=1,
        maximum=4096,
        unit="threads",
        commands=(*RUN, "features"),
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES),
    ),
    Option("reference_drafter", "path", "also evaluate this drafter on the same hidden states"),
    Option(
        "sglang_url",
        "text",
        "get completions from SGLang's /generate (default: local greedy); @FILE reads the URL "
        "from FILE, keeping credentials out of the command line",
    ),
    Option(
        "completions",
        "text",
        "where the reference completions come from: sglang (the server of --sglang-url, or of "
        "the inventory's sglang_url; the default when there is one, at T = 0) or local (greedy "
        "decoding with the target on this host)",
        choices=("sglang", "local"),
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES),
        stored=False,
    ),
    Option("cache_dir", "path", "completion/hidden-state cache", default=CACHE_DIR),
    Option(
        "no_cache",
        "switch",
        "neither read nor write the harness's completion/hidden-state cache",
        default=False,
        tasks=EVAL_TASKS,
        stored=False,
    ),
    Option(
        "dtype",
        "dtype",
        "drafter dtype (default: the profile's, else float32)",
        choices=DTYPES,
        tasks=EVAL_TASKS,
    ),
    Option(
        "target_dtype",
        "dtype",
        "target dtype (auto: as saved; float32 for linear attention on CPU)",
        default="auto",
        choices=("auto", *DTYPES),
        commands=(*RUN, "features"),
        tasks=(*EVAL_TASKS, EXTRACT_FEATURES),
    ),
    Option(
        "safe_globals",
        "names",
        "also unpickle these inert globals (comma-separated groups argparse, numpy, pathlib, "
        "datetime, or their dotted names); nothing else beyond weights",
        default=[],
        commands=(*RUN, "extract"),
        tasks=EVAL_TASKS,
    ),
    Option(
        "allow_unsafe_pickle",
        "switch",
        "unpickle checkpoints that need more than weights_only (runs code from the file; recorded)",
        default=False,
        commands=(*RUN, "extract"),
        tasks=EVAL_TASKS,
    ),
    Option(
        "chunk_anchors",
        "int",
        "anchors per batched drafter pass",
        minimum=1,
        maximum=1 << 16,
        unit="anchors",
        tasks=EVAL_TASKS,
    ),
    Option(
        "per_block",
        "switch",
        "one drafter forward per block (the unbatched comparison; slow)",
        default=False,
        tasks=EVAL_TASKS,
    ),
    Option(
        "temperature",
        "float",
        "sample at this temperature: the target samples each completion and the drafter its "
        "slots (0: greedy; docs/sampling.md)",
        default=0.0,
        minimum=0,
        maximum=100,
        tasks=EVAL_TASKS,
    ),
    Option(
        "top_p",
        "float",
        "top-p at T > 0 (1: off)",
        default=1.0,
        minimum=0,
        maximum=1,
        above_minimum=True,
        tasks=EVAL_TASKS,
    ),
    Option(
        "top_k",
        "int",
        "top-k at T > 0 (0: off)",
        default=0,
        minimum=0,
        maximum=LIMIT,
        unit="tokens",
        tasks=EVAL_TASKS,
    ),
    Option(
        "seed",
        "int",
        "seed of the sampled completions and Monte Carlo walks",
        default=0,
        minimum=0,
        maximum=INT64_MAX,
        tasks=EVAL_TASKS,
    ),
    Option(
        "samples",
        "int",
        "Monte Carlo walks per prompt at T > 0 (at least 2, for an interval)",
        default=1000,
        minimum=2,
        maximum=1_000_000,
        unit="walks",
        tasks=EVAL_TASKS,
    ),
    Option(
        "paths",
        "int",
        "sampled completions per prompt at T > 0, each a completion, its hidden states and a walk",
        default=4,
        minimum=1,
        maximum=1024,  # 1024 paths of a prompt set would take days
        unit="paths",
        tasks=EVAL_TASKS,
    ),
    Option(
        "step",
        "int",
        "record this step (default: from the checkpoint)",
        minimum=0,
        maximum=MAX_STEP,
    ),
    Option(
        "device",
        "text",
        "where the drafter runs and the target computes features and completions: cpu, or "
        "cuda on a host with a free GPU (recorded in the results); auto: CUDA when torch sees "
        "a GPU (default: cpu for eval, auto for features)",
        choices=("auto", "cpu", "cuda"),
        commands=(*RUN, "features"),
        tasks=EVAL_TASKS,
    ),
    Option(
        "shard_gpus",
        "switch",
        "split the target over every GPU torch sees, in order (CUDA_VISIBLE_DEVICES picks "
        "them; the inventory's `gpus` sets it)",
        default=False,
        commands=("features",),
    ),
    Option(
        "gpu_memory",
        "int",
        "with --shard-gpus: at most this many bytes of target weights per GPU (leave room for "
        "activations; the inventory's `gpu_memory`)",
        minimum=1,
        maximum=1 << 44,  # 16 TiB: far past any one GPU
        unit="bytes",
        commands=("features",),
    ),
    Option(
        "verify",
        "switch",
        "hash the checkpoint even when the staging manifest beside it records its sha256",
        default=False,
        tasks=(RUN_EVAL,),
    ),
)

BY_NAME = {option.name: option for option in OPTIONS}


def for_command(command: str) -> list[Option]:
    """The options a harness command takes, in the table's order."""
    return [option for option in OPTIONS if command in option.commands]


def for_task(task: str) -> list[Option]:
    """The options a fab task takes and passes on as is, in the table's order."""
    return [option for option in OPTIONS if task in option.tasks]


def default(name: str) -> object:
    """An option's default, a fresh copy (list defaults are never shared)."""
    value = BY_NAME[name].default
    return list(value) if isinstance(value, list) else value


def parse(option: Option, value: object) -> object:
    """`value` (text from a command line, or already typed) as the option's kind, checked;
    None when not given. A HarnessError names the flag, what was expected and what found."""
    # An empty number is refused (it would silently mean the default); an empty list is none.
    if value is None or (value == "" and option.kind in ("text", "dtype", "path", "on-off")):
        return None
    if option.kind == "switch":
        return bool(value)
    if option.kind == "on-off":
        if isinstance(value, bool):
            return value
        if value not in ("on", "off"):
            raise HarnessError(f"{option.flag}: expected one of on, off, found {value!r}")
        return value == "on"
    if option.kind in ("int", "float"):
        return _number(option, value)
    if option.kind in ("ints", "names"):
        listed = value.split(",") if isinstance(value, str) else value
        items = [text for text in (str(item).strip() for item in listed) if text]
        return [_number(option, item) for item in items] if option.kind == "ints" else items
    if option.kind == "path":
        return Path(str(value))
    if option.kind == "dtype":
        value = dtype_name(str(value))
    if option.choices and value not in option.choices:
        raise HarnessError(
            f"{option.flag}: expected one of {', '.join(option.choices)}, found {value!r}"
        )
    return str(value)


def _number(option: Option, value: object) -> int | float:
    """A number the table declares, read by the one parser of numbers
    (dflash_eval.contract.numbers)."""
    return parse_number(
        option.flag,
        value,
        minimum=option.minimum,
        maximum=option.maximum,
        whole=option.kind in ("int", "ints"),
        unit=option.unit,
        above_minimum=option.above_minimum,
    )


def span_text(option: Option) -> str:
    """A numeric option's range with its unit, as its help shows it ("" for other kinds)."""
    if option.kind not in ("int", "float", "ints"):
        return ""
    return span(option.minimum, option.maximum, option.unit, option.above_minimum)


def as_text(option: Option, value: object) -> str:
    """A parsed value as its command-line text (a switch has none: its flag is enough)."""
    if option.kind == "on-off":
        return "on" if value else "off"
    if option.kind in ("ints", "names"):
        return ",".join(str(item) for item in value)
    return str(value)


def help_text(option: Option) -> str:
    """The option's help with its default, as argparse and fab show it."""
    described = option.help
    if span_text(option):
        described += f"; {'each ' if option.kind == 'ints' else ''}{span_text(option)}"
    if option.choices:
        described += f"; one of {', '.join(option.choices)}"
    elif option.kind == "on-off":
        described += "; on or off"
    if option.kind == "dtype":
        described += " (aliases bf16, fp32 accepted)"
    shown = option.default
    if shown in (None, []) or option.kind == "switch":
        return described
    if isinstance(shown, Path) and shown.is_relative_to(Path.home()):
        shown = f"~/{shown.relative_to(Path.home())}"
    return f"{described} (default {as_text(option, shown)})"


def check(values: object, names: Iterable[str] | None = None) -> None:
    """Every number among `names` (default: all) that `values` has as an attribute, in range
    (for options built in code, not parsed by argparse): a HarnessError naming the flag."""
    for option in OPTIONS:
        if (names is not None and option.name not in names) or not hasattr(values, option.name):
            continue
        value = getattr(values, option.name)
        if value is not None and option.kind in ("int", "float", "ints"):
            parse(option, value)
