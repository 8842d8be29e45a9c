"""The results JSON's key names and its one human summary, shared by both sides.

The harness writes results with these names (evaluate.py); the workstation reads them with
the same names (`from dflash_eval import schema` in dflash_ops). Stdlib only and no imports
from the rest of the harness: importing this module must never load torch.

docs/results-schema.md says what each key holds; this module is where their names live.
Bump SCHEMA_VERSION whenever a key changes meaning or disappears (new keys do not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# 2: τ as z-lab's live loop counts it (metrics.tau_convention). 3: drafter masks as z-lab's
# current code (07ebd93) builds them (causal sliding layers, is_causal); `capped` is that
# code's loop exactly. Schema-2 results stay readable; `compare` keeps apart those whose
# drafter has sliding layers ("attention rule").
SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (2, 3)
KIND = "dflash-eval-results"  # the value of results[KIND_KEY]

# --- top level -----------------------------------------------------------------------------
SCHEMA_VERSION_KEY = "schema_version"
KIND_KEY = "kind"
CREATED_AT = "created_at"
CHECKPOINT = "checkpoint"
DRAFTER = "drafter"
TARGET = "target"
PROMPTS = "prompts"
COMPLETIONS = "completions"
HARNESS = "harness"
LIBRARIES = "libraries"
HOST = "host"
OPTIONS = "options"
TIMINGS = "timings_s"
THROUGHPUT = "throughput"
METRICS = "metrics"
PER_PROMPT = "per_prompt"
BY_DATASET = "by_dataset"  # {BOOTSTRAP, OVERALL, DATASETS}: metrics with confidence intervals
REFERENCE = "reference"  # null, or {CHECKPOINT, DRAFTER, METRICS, THROUGHPUT}
COMPARISON = "comparison"  # null, or {TAU_MACRO: ratio, TAU_POOLED: ratio}
WARNINGS = "warnings"
SAMPLES = "samples"  # decoded samples: the first prompts' target text and drafts
FEATURES = "features"  # where/how the target's hidden states were computed, and their fidelity

# --- results[FEATURES] -------------------------------------------------------------------------
FEATURES_HOST = "host"
FEATURES_DEVICE = "device"
FEATURES_DTYPE = "dtype"
FEATURES_KERNEL = "kernel"  # {"attention": "sdpa", "linear_attention": "torch fallback" | "fla …"}
FEATURES_LIBRARIES = "libraries"
FIDELITY = "fidelity"  # {"status": "measured" | "not needed" | "skipped", "layers": {…}, …}
FEATURES_IDENTITY = (
    FEATURES_HOST,
    FEATURES_DEVICE,
    FEATURES_DTYPE,
    FEATURES_KERNEL,
    FEATURES_LIBRARIES,
)

# --- checkpoint identity: results[CHECKPOINT] and results[REFERENCE][CHECKPOINT] -------------
PATH = "path"
SIZE_BYTES = "size_bytes"
SHA256 = "sha256"
SHA256_SOURCE = "sha256_source"  # "hashed" | "staging manifest" (trusted: size and mtime fit)
STEP = "step"
TRAINING_RUN = "training_run"  # the training run it belongs to (absent: the trainer's own)

# --- results[TARGET] ---------------------------------------------------------------------------
TARGET_NAME = "name"
TARGET_FAMILY = "family"
TARGET_FINGERPRINT = "fingerprint"

# --- results[PROMPTS] --------------------------------------------------------------------------
PROMPT_COUNT = "count"
PROMPTS_SHA256 = "sha256"
MAX_NEW_TOKENS = "max_new_tokens"
THINKING = "thinking"  # "on" | "off": what the chat template was asked for (absent before: off)
PROMPT_SETS = "datasets"  # {name: {PROMPT_COUNT, PROMPTS_SHA256, SOURCE}} of named prompt sets
SOURCE = "source"  # where a named set came from (repo, revision, split, seed, rows' hash…)

# --- results[COMPLETIONS] ----------------------------------------------------------------------
COMPLETIONS_SOURCE = "source"
EXTRA_TOKENS = "extra_tokens"  # reference tokens past max_new_tokens (block size): last round

# --- results[HARNESS] --------------------------------------------------------------------------
HARNESS_SHA256 = "content_sha256"

# --- results[HOST], results[TIMINGS] -----------------------------------------------------------
TORCH_THREADS = "torch_threads"
TOTAL_SECONDS = "total"

# --- results[THROUGHPUT] (and the reference's) -------------------------------------------------
BLOCKS = "blocks"
SECONDS = "seconds"
BLOCKS_PER_S = "blocks_per_s"

# --- results[METRICS] (and the reference's); each DDTree budget has the τ and count keys -------
BLOCK_SIZE = "block_size"
TAU_MACRO = "tau_macro"
TAU_POOLED = "tau_pooled"
ROUNDS = "rounds"
COMMITTED_TOKENS = "committed_tokens"
HISTOGRAM = "histogram"
PER_POSITION = "per_position"  # a list of rows, one per block position k = 1..B-1
TAU_CONVENTION = "tau_convention"  # "zlab-live-loop": rounds start below max_new_tokens
CAPPED = "capped"  # the same τ with the last round capped at the completion (schema 1)
DDTREE = "ddtree"  # {"<budget>": {TAU_MACRO, TAU_POOLED, ROUNDS, COMMITTED_TOKENS}}
POSITION = "position"
CONDITIONAL = "conditional"  # P(slot k correct | slots < k correct)

# --- results[PER_PROMPT] rows (one per prompt; a multi-turn conversation has one per turn) ---
PROMPT_ID = "id"
PROMPT_DATASET = "dataset"  # the named set it came from, or null
PROMPT_CONVERSATION = "conversation"  # id of its conversation's first turn (itself if single)
PROMPT_TAU = "tau"
PROMPT_DDTREE_TAU = "ddtree_tau"  # {"<budget>": τ}
PROMPT_ACCEPTANCE = "acceptance"  # {HITS: [k=1..], TRIALS: [k=1..]}: conditional, per position
HITS = "hits"
TRIALS = "trials"

# --- results[BY_DATASET] ---------------------------------------------------------------------
BOOTSTRAP = "bootstrap"  # {"method", "unit", "resamples", "seed", "level"}
OVERALL = "overall"  # a group: every prompt
DATASETS = "datasets"  # {name: group}
GROUP_PROMPTS = "prompts"
GROUP_UNITS = "units"  # conversations resampled (= prompts when no set is multi-turn)
# A group holds TAU_MACRO, TAU_POOLED: intervals; ROUNDS; DDTREE: {"<budget>": {TAU_MACRO:
# interval}}; PER_POSITION: [{POSITION, CONDITIONAL: interval}]. An interval is {VALUE, LOW, HIGH}
# (LOW, HIGH null from a single unit: no spread to resample) or null (undefined: no rounds).
VALUE = "value"
LOW = "low"
HIGH = "high"

# What must match for two runs' numbers to be comparable, and how to read it from results.
COMPARABILITY: dict[str, Callable[[dict], Any]] = {
    "prompts": lambda r: r[PROMPTS][PROMPTS_SHA256],
    "target": lambda r: r[TARGET][TARGET_FINGERPRINT],
    "block size": lambda r: r[METRICS][BLOCK_SIZE],
    "max new tokens": lambda r: r[PROMPTS][MAX_NEW_TOKENS],
    "completions": lambda r: r[COMPLETIONS][COMPLETIONS_SOURCE],
    "max blocks": lambda r: r[OPTIONS].get("max_blocks"),
    "target dtype": lambda r: r[TARGET].get("dtype"),
    "drafter dtype": lambda r: (r[DRAFTER].get(SETTINGS) or {}).get("dtype"),
    "thinking": lambda r: r[OPTIONS].get("thinking"),
    "features": lambda r: features_identity(r),
    "τ convention": lambda r: r[METRICS].get(TAU_CONVENTION),
    "attention rule": lambda r: attention_rule(r),
    "harness": lambda r: r[HARNESS][HARNESS_SHA256],
}

# Why a difference in a comparability key matters, where the name alone does not say it.
COMPARABILITY_WHY = {
    "attention rule": "results before schema 3 masked sliding-window layers both ways; z-lab's "
    "current code (07ebd93) makes them causal unless the config's is_causal says otherwise",
}

POSITIONS_SUMMARISED = 8  # per-position acceptance shown for the first positions only


# --- results[DRAFTER]: each setting's value and where it came from ---------------------------
SETTINGS = "settings"
SETTINGS_PROVENANCE = "provenance"
ATTENTION = "attention"  # per drafter layer: {"kind", "causal", "window"} (schema 3)
ACCEPTED_KEYS = "accepted_config_keys"  # {key: value}: unknown keys the profile accepted
ACCEPTED_DEFAULTS = "accepted_defaults"
DRAFTER_SETTINGS = (
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "num_target_layers",
    "rope",
    "dtype",
)

# --- reading -----------------------------------------------------------------------------------


def step(results: dict) -> int | None:
    return results[CHECKPOINT][STEP]


def training_run(results: dict) -> str | None:
    return results[CHECKPOINT].get(TRAINING_RUN)


def metrics(results: dict) -> dict:
    return results[METRICS]


def reference_metrics(results: dict) -> dict | None:
    """The reference drafter's metrics, or None when the run evaluated none."""
    reference = results.get(REFERENCE)
    return reference[METRICS] if reference else None


def ratio_to_reference(results: dict) -> float | None:
    """τ macro of this drafter over the reference drafter's (None without a reference)."""
    return (results.get(COMPARISON) or {}).get(TAU_MACRO)


def budgets(run_metrics: dict) -> list[str]:
    """The DDTree budgets evaluated, as the JSON's string keys."""
    return list(run_metrics[DDTREE])


def ddtree_tau(run_metrics: dict, budget: str) -> float | None:
    """DDTree τ macro at `budget` (None when that budget was not evaluated)."""
    return run_metrics[DDTREE].get(budget, {}).get(TAU_MACRO)


def conditional_by_position(run_metrics: dict) -> dict[int, float | None]:
    return {row[POSITION]: row[CONDITIONAL] for row in run_metrics[PER_POSITION]}


def overall_group(results: dict) -> dict | None:
    """Every prompt's metrics with their confidence intervals (None for results written
    before intervals were)."""
    block = results.get(BY_DATASET)
    return block[OVERALL] if block else None


def dataset_groups(results: dict) -> dict[str, dict]:
    """Each named prompt set's metrics with their intervals ({} when there are none)."""
    block = results.get(BY_DATASET)
    return block[DATASETS] if block else {}


def group_interval(group: dict | None, metric: str = TAU_MACRO) -> dict | None:
    """A group's TAU_MACRO or TAU_POOLED as {VALUE, LOW, HIGH} (None when undefined)."""
    return group.get(metric) if group else None


def group_ddtree(group: dict | None, budget: str) -> dict | None:
    """A group's DDTree τ macro at `budget` with its interval."""
    return (group or {}).get(DDTREE, {}).get(budget, {}).get(TAU_MACRO)


def group_conditional(group: dict | None) -> dict[int, dict | None]:
    """A group's conditional acceptance per block position, each with its interval."""
    return {row[POSITION]: row[CONDITIONAL] for row in (group or {}).get(PER_POSITION, [])}


def bootstrap_settings(results: dict) -> dict | None:
    block = results.get(BY_DATASET)
    return block[BOOTSTRAP] if block else None


def overlaps(first: dict | None, second: dict | None) -> bool | None:
    """Whether two intervals share a point (None when either is missing or unbounded)."""
    if not first or not second or None in (first[LOW], second[LOW]):
        return None
    return first[LOW] <= second[HIGH] and second[LOW] <= first[HIGH]


def format_interval(interval: dict | None, digits: int = 3) -> str:
    """'3.210 [2.980, 3.450]', '3.210 [one unit: no interval]', or 'n/a'."""
    if not interval:
        return "n/a"
    if interval[LOW] is None:
        return f"{interval[VALUE]:.{digits}f} [one unit: no interval]"
    return f"{interval[VALUE]:.{digits}f} [{interval[LOW]:.{digits}f}, {interval[HIGH]:.{digits}f}]"


def features_identity(results: dict) -> dict | None:
    """What computed the features (host, device, dtype, kernels, libraries); None for results
    written before the harness recorded it."""
    features = results.get(FEATURES)
    return {name: features.get(name) for name in FEATURES_IDENTITY} if features else None


def attention_rule(results: dict) -> str | None:
    """The mask rule the drafter was evaluated under, where it matters: None for a drafter of
    plain full, non-causal layers (every schema masked those alike)."""
    drafter = results[DRAFTER]
    layers = drafter.get(ATTENTION)
    if layers is None:  # schema 2 recorded no rule: sliding layers were non-causal
        layer_types = (drafter.get("config") or {}).get("layer_types") or []
        return "sliding both ways (schema 2)" if "sliding_attention" in layer_types else None
    if all(layer["kind"] == "full_attention" and not layer["causal"] for layer in layers):
        return None
    return "zlab 07ebd93"


def comparability_key(results: dict) -> dict[str, Any]:
    """Everything that must match for two results to be compared, by what it is called."""
    return {name: read(results) for name, read in COMPARABILITY.items()}


def shape_problem(results: Any) -> str | None:
    """Why `results` cannot be read as a results file of this schema (None: it can). Every
    reader above must work on it, so a damaged or foreign file is caught once, on loading."""
    if not isinstance(results, dict) or results.get(KIND_KEY) != KIND:
        return f"not a dflash-eval results file ({KIND_KEY!r} is not {KIND!r})"
    if results.get(SCHEMA_VERSION_KEY) not in READABLE_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, READABLE_SCHEMA_VERSIONS))
        return (
            f"schema_version {results.get(SCHEMA_VERSION_KEY)!r}, this dflash-ops reads "
            f"{readable}: compare it with the dflash-ops that wrote it"
        )
    try:
        step(results)
        run_metrics = metrics(results)
        for key in (TAU_MACRO, TAU_POOLED):
            float(run_metrics[key])
        for budget in budgets(run_metrics):
            ddtree_tau(run_metrics, budget)
        conditional_by_position(run_metrics)
        comparability_key(results)
        summary_lines(results)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        return f"missing or malformed field ({type(exc).__name__}: {exc})"
    return None


# --- summaries ---------------------------------------------------------------------------------


def headline(results: dict) -> dict[str, Any]:
    """The key numbers of one results dict: the harness's `done` event carries them."""
    run_metrics = metrics(results)
    reference = reference_metrics(results)
    return {
        "step": step(results),
        "tau_macro": run_metrics[TAU_MACRO],
        "tau_pooled": run_metrics[TAU_POOLED],
        "rounds": run_metrics[ROUNDS],
        "ddtree": {b: ddtree_tau(run_metrics, b) for b in budgets(run_metrics)},
        "reference_tau_macro": reference[TAU_MACRO] if reference else None,
        "seconds": results[TIMINGS][TOTAL_SECONDS],
    }


def summary_lines(results: dict) -> list[str]:
    """The human summary of one results dict: the harness prints it to its log, the
    workstation after pulling a run. The JSON holds everything else."""
    run_metrics = metrics(results)
    lines = [
        f"step {step(results)}  τ macro {_number(run_metrics[TAU_MACRO])}  "
        f"τ pooled {_number(run_metrics[TAU_POOLED])}  ({run_metrics[ROUNDS]} rounds, "
        f"{run_metrics[COMMITTED_TOKENS]} tokens, block size {run_metrics[BLOCK_SIZE]})"
    ]
    capped = run_metrics.get(CAPPED)
    if capped:
        lines.append(
            "  τ as z-lab's live loop counts it (last round uncapped); capped at the "
            f"completion end: macro {_number(capped[TAU_MACRO])}, "
            f"pooled {_number(capped[TAU_POOLED])}"
        )
    if budgets(run_metrics):
        lines.append(
            "DDTree τ: "
            + ", ".join(
                f"b={b}: {_number(ddtree_tau(run_metrics, b))}" for b in budgets(run_metrics)
            )
        )
    accepted = list(conditional_by_position(run_metrics).items())[:POSITIONS_SUMMARISED]
    lines.append(
        "acceptance by position (conditional): "
        + ", ".join(f"{position}:{_number(rate, 2)}" for position, rate in accepted)
    )
    lines += _interval_lines(results)
    reference = reference_metrics(results)
    if reference:
        ratio = ratio_to_reference(results)
        lines.append(
            f"reference drafter τ macro {_number(reference[TAU_MACRO])}"
            + (f" (this run: {ratio:.2f}× of it)" if ratio else "")
        )
    if (results.get(DRAFTER) or {}).get(SETTINGS_PROVENANCE):
        lines.append(settings_line(results[DRAFTER]))
    lines += _provenance_lines(results)
    lines += sample_lines(results, prompts=1, rounds=2)
    lines += [f"WARNING: {warning}" for warning in results.get(WARNINGS) or []]
    return lines


def sample_lines(results: dict, prompts: int | None = None, rounds: int | None = None) -> list[str]:
    """The decoded drafts next to the target's text, so that garbage is seen at a glance."""
    lines = []
    for sample in (results.get(SAMPLES) or [])[:prompts]:
        for shown in sample.get("rounds", [])[:rounds]:
            lines.append(
                f"sample {sample.get('id')} @{shown.get('position')} (accepted "
                f"{shown.get('accepted')}): target {shown.get('target')!r}  draft "
                f"{shown.get('draft')!r}"
            )
    return lines


def _interval_lines(results: dict) -> list[str]:
    """τ with its confidence interval, overall and per named prompt set."""
    settings = bootstrap_settings(results)
    if not settings:
        return []
    groups = {"all prompts": overall_group(results), **dataset_groups(results)}
    lines = [
        f"{settings['level']:.0%} confidence intervals (bootstrap over "
        f"{settings['unit']}s, {settings['resamples']} resamples, seed {settings['seed']}):"
    ]
    for name, group in groups.items():
        budget = max(group[DDTREE], key=int, default=None)
        lines.append(
            f"  {name} ({group[GROUP_PROMPTS]} prompts): "
            f"τ macro {format_interval(group_interval(group, TAU_MACRO))}, "
            f"τ pooled {format_interval(group_interval(group, TAU_POOLED))}"
            + (
                f", DDTree-{budget} τ {format_interval(group_ddtree(group, budget))}"
                if budget
                else ""
            )
        )
    return lines


def _provenance_lines(results: dict) -> list[str]:
    """What was evaluated, on what, and how long it took."""
    checkpoint, target = results[CHECKPOINT], results[TARGET]
    throughput = results[THROUGHPUT]
    return [
        f"Checkpoint {checkpoint[PATH]} ({checkpoint[SIZE_BYTES]} bytes, "
        f"sha256 {checkpoint[SHA256][:12]}…)",
        f"Target {target[TARGET_NAME]} ({target[TARGET_FAMILY]}), "
        f"{results[PROMPTS][PROMPT_COUNT]} prompts" + _prompt_sets_note(results[PROMPTS]),
        f"Drafter: {throughput[BLOCKS]} blocks in {throughput[SECONDS]} s "
        f"({throughput[BLOCKS_PER_S]} blocks/s, {results[HOST][TORCH_THREADS]} threads); "
        f"total {results[TIMINGS][TOTAL_SECONDS]:.1f} s",
    ]


def _prompt_sets_note(prompts: dict) -> str:
    """' (gsm8k 20: openai/gsm8k@1a2b3c4d5e6f, …; thinking off)', or '' for plain prompts."""
    sets = prompts.get(PROMPT_SETS) or {}
    if not sets:
        return ""
    described = []
    for name, entry in sets.items():
        source = entry.get(SOURCE) or {}
        origin = source.get("repo") or source.get("files") or "?"
        revision = source.get("revision")
        described.append(
            f"{name} {entry[PROMPT_COUNT]}: {origin}" + (f"@{revision[:12]}" if revision else "")
        )
    return f" ({'; '.join(described)}; thinking {prompts.get(THINKING, 'off')})"


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_setting(name: str, value: Any) -> str:
    """A setting's value as people read it (layer ids as a list, RoPE in one phrase)."""
    if isinstance(value, tuple):
        return str(list(value))
    if name == "rope" and isinstance(value, Mapping):
        extras = ", ".join(
            f"{k} {v}" for k, v in value.items() if k not in ("rope_type", "rope_theta")
        )
        theta = value.get("rope_theta")
        return f"{value.get('rope_type')} (θ {theta:g}{', ' + extras if extras else ''})"
    return str(value)


def settings_line(drafter: Mapping[str, Any]) -> str:
    """One line for the human summary, from a results JSON `drafter` block."""
    values, sources = drafter.get(SETTINGS) or {}, drafter.get(SETTINGS_PROVENANCE) or {}
    accepted = drafter.get(ACCEPTED_DEFAULTS) or {}
    parts = []
    for name in DRAFTER_SETTINGS:
        if name not in sources:
            continue
        source = sources[name]
        if name in accepted:
            source += f", accepted by {accepted[name]}"
        parts.append(f"{name} {format_setting(name, _as_tuple(values.get(name)))} ({source})")
    return "Drafter settings: " + "; ".join(parts)


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
