"""The results JSON as types: one TypedDict per object, each field documented once, here.

The harness assembles a `Results` (run/record.py) and writes it as JSON; the workstation reads
it back through `schema_check.parse_results` and the same types (dflash_ops.evaluation).
docs/results-schema.md shows these docstrings as tables (schema_doc.py writes them; a test
checks that the page matches). Stdlib only and no imports from the rest of the harness:
importing this module must never load torch.

Keys that results written earlier under the same SCHEMA_VERSION lack live in a `total=False`
class over the always-present ones (the form Python 3.10 understands). Classes run from the
leaves up to `Results`, so every annotation is a plain runtime type. Bump SCHEMA_VERSION
whenever a key changes meaning or disappears (new keys do not).
"""

from typing import Any, Literal, TypedDict

from dflash_eval.contract.schema_metrics import ByDataset, Metrics, PromptRow, Sample, Throughput

# 2: τ as z-lab's live loop counts it (metrics.tau_convention). 3: drafter masks as z-lab's
# current code (07ebd93) builds them (causal sliding layers, is_causal); `capped` is that
# code's loop exactly. Schema-2 results stay readable (their keys are a subset); comparisons
# keep apart those whose drafter has sliding layers (reading.COMPARABILITY, "attention rule").
SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (2, 3)
KIND = "dflash-eval-results"  # the value of results["kind"]

# --- checkpoint --------------------------------------------------------------------------------


class _FileEntryKeys(TypedDict):
    path: str
    size_bytes: int
    sha256: str


class FileEntry(_FileEntryKeys, total=False):
    sha256_source: str
    """`hashed` or `staging manifest`, as for the whole checkpoint."""


class PickleRecord(TypedDict):
    policy: str
    """`weights-only` | `weights-only + named safe globals` | `unsafe allowed
    (--allow-unsafe-pickle)`."""
    safe_globals: list[str]
    """The dotted names admitted."""
    loaded_with: str
    """`weights-only` | `weights-only + named safe globals` | `full unpickle
    (--allow-unsafe-pickle)`."""
    file_globals: list[str] | None
    """The globals the file names beyond torch's own, read without unpickling; null for the
    legacy non-zip format."""


class _CheckpointKeys(TypedDict):
    path: str
    """The checkpoint file or directory as the harness read it."""
    format: str
    """`training-checkpoint` | `hf-directory` | `extracted`."""
    size_bytes: int
    """Sum of its files' sizes."""
    sha256: str
    """Of the file; for a directory, sha256 of the concatenated file hashes."""
    files: list[FileEntry]
    """Each file read."""
    step: int | None
    """The training step (null when nothing states it)."""
    step_source: str | None
    """`checkpoint 'step'`, `path`, `extract provenance` or `--step`."""
    stripped_prefix: str
    """The prefix removed from every parameter name (e.g. `module.`)."""
    dropped_entries: list[str]
    """Top-level checkpoint keys not loaded: optimizer, scheduler…"""
    ignored_parameters: list[str]
    """Copies of the target's `embed_tokens`/`lm_head` set aside."""


class Checkpoint(_CheckpointKeys, total=False):
    sha256_source: str
    """`hashed`, or `staging manifest`: taken from `NAME.manifest.json` beside the file,
    trusted only when it states the file's size and the file is not newer than it
    (`--verify` always hashes); `mixed` across files."""
    renamed_parameters: int
    """Names changed by the profile's `parameter_renames`."""
    pickle: PickleRecord | None
    """Null for safetensors; else see "Pickle policy"."""
    training_run: str
    """The inventory's training run the checkpoint came from (`fab … --run NAME`); absent
    for the trainer's own checkpoints."""


# --- drafter -----------------------------------------------------------------------------------

# The settings `Drafter.settings` holds, in the order the summary prints them.
DRAFTER_SETTINGS = (
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "num_target_layers",
    "rope",
    "dtype",
)


class ProfileRecord(TypedDict):
    path: str
    name: str | None
    content: dict[str, Any]
    """Everything the profile file said."""


class LayerAttentionRecord(TypedDict):
    kind: Literal["full_attention", "sliding_attention"]
    causal: bool
    """The layer's queries see no key ahead of them."""
    window: int | None
    """Keys must be less than this many positions away (null: no window)."""


class _DrafterKeys(TypedDict):
    config: dict[str, Any]
    """The Hugging Face DFlash config dict, as evaluated."""
    config_source: str
    """Where the architecture came from: `checkpoint` | `file PATH` | `profile NAME` |
    `inferred from parameter shapes + target config`."""
    config_notes: list[str]
    """Settings not from the architecture's own config, with their sources; window notes."""
    trained_block_size: int | None
    """The block size the describing sources state."""
    eval_block_size: int
    dtype: str | None
    """The drafter's dtype."""
    parameters: int
    """Parameter count."""


class Drafter(_DrafterKeys, total=False):
    architecture: str
    """z-lab's class for this drafter: `DFlashDraftModel` | `DFlash2DraftModel`
    (docs/dflash2.md); absent in older results: DFlash."""
    attention: list[LayerAttentionRecord]
    """Per drafter layer, the mask rule it was evaluated with (docs/harness-spec.md); absent
    in schema 2, whose every layer was non-causal (a window looked both ways)."""
    accepted_config_keys: dict[str, Any]
    """`{key: value}`: config keys of unknown meaning the profile's `accept_keys` let through
    (`dflash_config.KEY` for nested ones); absent in schema 2."""
    settings: dict[str, Any]
    """The value of each of `block_size`, `target_layer_ids`, `mask_token_id`,
    `num_target_layers`, `rope` (transformers' `rope_parameters`) and `dtype` (see
    "Provenance")."""
    provenance: dict[str, str]
    """Where each setting's value came from (see "Provenance")."""
    accepted_defaults: dict[str, str]
    """`{setting: "command line" | "profile"}`: default rules the user confirmed."""
    profile: ProfileRecord | None
    """Null, or `--drafter-profile` as read."""


# --- target, prompts, completions, harness, host -----------------------------------------------


class Target(TypedDict):
    path: str
    name: str
    family: str
    """`model_type`, plus "+ vision-language wrapper" for a wrapped text model."""
    dtype: str
    """The dtype the target's embedding, head and (when loaded) body were read in."""
    num_layers: int
    hidden_size: int
    vocab_size: int
    """Embedding rows."""
    fingerprint: str
    """sha256 over `files`."""
    files: dict[str, dict[str, Any]]
    """Config and tokenizer files: `size`, `sha256`; weight files: `size`, `mtime_ns`,
    `sha256` of the safetensors header."""


class PromptSet(TypedDict):
    count: int
    sha256: str
    source: dict[str, Any] | None
    """Where the set came from, as its prompts file says (repository, revision, split,
    seed, rows' hash…)."""


class _PromptsKeys(TypedDict):
    source: str
    """`builtin` or the JSONL path."""
    count: int
    """Prompts; a conversation counts each turn."""
    sha256: str
    """Of each prompt's id and messages, in order, plus its set and the turn it follows when
    it has them."""
    chat_template: bool
    """Whether the tokenizer's chat template framed the prompts."""
    max_new_tokens: int
    stop_token_ids: list[int]


class Prompts(_PromptsKeys, total=False):
    thinking: Literal["on", "off"]
    """What the chat template was asked for (`enable_thinking`); absent: off."""
    template_reads_thinking: bool
    """The template has the `enable_thinking` switch."""
    datasets: dict[str, PromptSet]
    """Each named prompt set; `{}` for plain prompts."""


class _CompletionsKeys(TypedDict):
    source: Literal["local-greedy", "sglang", "local-sampled"]
    """`local-sampled`: at T > 0, sampled with the target itself (docs/sampling.md)."""
    sglang_url: str | None
    """The server: scheme, host and port only; `/***` where the URL had more (user, password,
    path and query may hold tokens)."""
    extra_tokens: int
    """How far each reference runs past the end of its completion: the drafter's block size,
    the larger one with `--reference-drafter` (see "metrics")."""


class Completions(_CompletionsKeys, total=False):
    sglang_model: str | None
    """The model the SGLang server said it serves (`model_path` of its /get_model_info),
    checked against the target before the run; null when no server was asked (local
    completions, or a feature set's)."""
    sglang_version: str | None
    """SGLang's version (`version` of its /get_server_info); null when not asked or not
    given."""


class _HarnessKeys(TypedDict):
    content_sha256: str
    """sha256 over the sorted relative paths and contents of every `*.py` of the deployed
    `dflash_eval` package (`version.harness_hash`): which code ran."""
    predictor: Literal["batched", "per-block"]


class Harness(_HarnessKeys, total=False):
    numerics_version: int
    """What the numbers mean (`version.NUMERICS_VERSION`): raised whenever a metric
    definition, the drafter's maths or a completion or feature rule changes a number.
    Comparisons key on it, not on the content hash. Absent in results written before it was
    recorded (see "Comparability")."""


class _HostKeys(TypedDict):
    hostname: str
    platform: str
    machine: str
    cpu_count: int | None
    torch_threads: int
    python_executable: str


class Host(_HostKeys, total=False):
    device: str
    """Where the drafters ran: `cpu`, or `cuda:N` (`--device cuda`, with the GPU's name
    after it). Absent in results made before the option existed: the CPU."""


# --- features ----------------------------------------------------------------------------------


class LayerFidelity(TypedDict):
    relative_error: float
    """‖f − f₃₂‖ / ‖f₃₂‖ over all positions of the layer."""
    cosine_mean: float
    cosine_min: float
    """The worst per-position cosine similarity."""


class _FidelityKeys(TypedDict):
    status: Literal["measured", "not needed", "skipped"]


class Fidelity(_FidelityKeys, total=False):
    reason: str
    """Why it was not needed (no linear-attention layer up to the deepest target layer, or
    float32 with the torch kernel, which *is* the reference) or skipped (no memory for the
    float32 copy; also a warning)."""
    reference: str
    """What the features were compared with."""
    layers: dict[str, LayerFidelity]
    """Per target layer id read."""
    bounds: dict[str, float]
    """`relative_error_max` 0.05, `cosine_min` 0.99."""
    within_bounds: bool
    prompt_tokens_compared: int


class TargetLoad(TypedDict):
    body_loaded: bool
    """False when every completion and hidden state came from the cache."""
    tensors_read: str | list[str]
    """`"all"`, or the `file:name` of each tensor read alone: the embedding and the LM head."""


class CacheCounts(TypedDict):
    completion_hits: int
    hidden_state_hits: int
    prompts: int


class _FeaturesKeys(TypedDict):
    host: str
    """The machine that computed the first prompt's hidden states (on a cache hit: the one
    that wrote the entry)."""
    device: str
    """`cpu` (the eval harness), or `cuda` on a features host."""
    dtype: str
    """The target dtype of the forward: `float32` | `bfloat16` | `float16`."""
    dtype_source: str
    """`--target-dtype`, `auto: as saved`, or `auto: float32 for linear attention on CPU`."""
    kernel: dict[str, str | dict[str, list[int]]]
    """What the forward ran, seen while it ran (target/kernels.py): `{"attention": "sdpa"}`
    plus, for targets with linear-attention layers, `"linear_attention"` (`"torch
    fallback"` or `"flash-linear-attention <version>"`) and `"conv1d"` (`"torch fallback"`
    or `"causal-conv1d <version>"`); a kind whose layers ran different kernels maps each
    kernel to its layers (the run then stops: it differs from what the cache key says)."""
    libraries: dict[str, str | None]
    """Versions of `torch`, `transformers`, `flash-linear-attention`, `triton`,
    `causal-conv1d` (null when absent)."""
    source: str
    """`computed here`, or `feature set` (`eval --features`: every field above and
    `fidelity` are the set's, as measured where it was computed)."""
    fidelity: Fidelity
    """How close the features are to float32 (see "What the fidelity numbers mean")."""
    target_load: TargetLoad
    cache: CacheCounts


class Placement(TypedDict):
    devices: list[str]
    """The devices the target was split over, in forward order (`cuda:0` … as the process
    saw them: the features host's `gpus`, through CUDA_VISIBLE_DEVICES)."""
    layers: dict[str, list[int]]
    """Per device, its first and last decoder layer."""
    weight_bytes: dict[str, int]
    """Per device, the bytes of target weights placed there."""
    cap_bytes: int | None
    """The features host's `gpu_memory`, or null for no cap."""


class Features(_FeaturesKeys, total=False):
    placement: Placement
    """Only when the target was split over several GPUs (a features host with `gpus`)."""
    set: str
    """With `--features` only: the feature set's directory name."""
    set_sha256: str
    """With `--features` only: the sha256 of the set's `feature-set.json` as this run read
    it; the workstation compares it with the one it recorded when the set was made or
    relayed, and flags the run when they differ (docs/features.md)."""
    target_match: Literal["fingerprint", "content"]
    """With `--features` only: `fingerprint` (the set was computed from these very files),
    or `content` (another host's copy: same config, tokenizer, weight names, sizes, headers
    and sampled bytes; only mtimes differ)."""


# The fields of Features that say what computed them: compared as one comparability field.
FEATURES_IDENTITY = ("host", "device", "dtype", "kernel", "libraries")

# --- the whole file ----------------------------------------------------------------------------


class Reference(TypedDict):
    checkpoint: Checkpoint
    drafter: Drafter
    metrics: Metrics
    throughput: Throughput
    samples: list[Sample]


class Comparison(TypedDict):
    tau_macro: float | None
    """Drafter / reference (null across block sizes: τ grows with the block)."""
    tau_pooled: float | None


class _ResultsKeys(TypedDict):
    schema_version: int
    kind: str
    """`"dflash-eval-results"`."""
    created_at: str
    """ISO-8601 UTC."""
    checkpoint: Checkpoint
    drafter: Drafter
    target: Target
    prompts: Prompts
    completions: Completions
    harness: Harness
    libraries: dict[str, str | None]
    """`python`, `torch`, `transformers`, `safetensors`, `tokenizers`, `requests` versions."""
    host: Host
    options: dict[str, Any]
    """Every eval option as given (paths as strings)."""
    timings_s: dict[str, float]
    """Seconds per phase: `load_target`, `load_drafter`, `hash`, `completions`,
    `hidden_states`, `drafter`, `reference_drafter` (if any), `intervals`, `total`."""
    throughput: Throughput
    metrics: Metrics
    per_prompt: list[PromptRow]
    """One row per prompt; a multi-turn conversation has one per turn."""
    samples: list[Sample]
    """Decoded drafts of 3 prompts from each named set in turn, to see what the drafter proposes."""
    reference: Reference | None
    """Null, or the `--reference-drafter`'s blocks (same completions and hidden states)."""
    comparison: Comparison | None
    """Null without a reference drafter."""
    warnings: list[str]
    """Flags overriding what the drafter was trained with, prompts without rounds,
    references too short to score the last rounds…; empty on a clean load."""


class Results(_ResultsKeys, total=False):
    features: Features
    """Where and how the target's hidden states were computed, and how close they are to
    float32."""
    by_dataset: ByDataset
    """The metrics overall and per named set, each with a 95 % confidence interval."""
