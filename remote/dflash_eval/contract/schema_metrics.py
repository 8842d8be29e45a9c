"""The numbers of the results JSON as types: metrics, per-prompt rows, decoded samples,
confidence intervals, throughput (the provenance around them is in schema.py, which says how
these types are used and documented). Stdlib only.

Counts typed `int | float` are whole numbers at T = 0 and expectations given the sampled
paths at T > 0 (docs/sampling.md "In the results").
"""

from typing import TypedDict


class Throughput(TypedDict):
    blocks: int
    """Drafter blocks computed."""
    seconds: float
    """Drafter time."""
    blocks_per_s: float | None


# --- metrics -----------------------------------------------------------------------------------


class TauBlock(TypedDict):
    tau_macro: float | None
    """Mean over prompts of each prompt's mean round length (paper and z-lab benchmark
    convention)."""
    tau_pooled: float | None
    """Sum of round lengths / rounds over all prompts (SGLang convention)."""
    rounds: int | float
    """At T > 0 the expected rounds given the sampled paths, as every count typed so."""
    committed_tokens: int | float
    """The sum of round lengths (may exceed the completion tokens: last rounds run past the
    end)."""


class PositionRate(TypedDict):
    position: int
    """k = 1..B−1."""
    conditional: float | None
    """P(slot k correct | slots < k correct); null when no round qualifies."""
    unconditional: float | None
    """P(slot k correct)."""
    conditional_rounds: int | float
    rounds: int | float
    """Rounds where slot k was checked: all of them."""


class _CappedKeys(TauBlock):
    ddtree: dict[str, TauBlock]


# --- metrics.sampling (T > 0) ------------------------------------------------------------------


class MeanInterval(TypedDict):
    value: float
    """The mean over the Monte Carlo samples."""
    low: float
    high: float
    """`value` ± z·sd/√samples."""


class MonteCarlo(TypedDict):
    samples: int
    """Walks per prompt (`--samples`)."""
    level: float
    """0.95."""
    method: str
    """`normal: mean ± z·sd/√samples`."""
    tau_macro: MeanInterval | None
    """Each sample's τ macro over all prompts: their mean and interval; null when no prompt
    has a round."""
    tau_pooled: MeanInterval | None
    """Each sample's Σ tokens / Σ rounds over all prompts."""


class IntervalBounds(TypedDict):
    value: float
    """The run's figure: τ macro, the mean of the prompt means; τ pooled, Σ E[tokens] /
    Σ E[rounds]."""
    low: float | None
    high: float | None
    """Null with a single prompt (conversation): no spread to estimate."""


class PathsInterval(TypedDict):
    method: str
    """Student-t over prompt means, conversations as units (docs/sampling.md)."""
    level: float
    """0.95."""
    paths: int
    """Sampled completions per prompt (`--paths`)."""
    units: int
    """Conversations (single-turn prompts) with a round: the t's degrees of freedom + 1."""
    tau_macro: IntervalBounds | None
    """The interval for the live loop's expected τ on these prompts; null without rounds."""
    tau_pooled: IntervalBounds | None
    warning: str | None
    """Set when there are too few prompts for a reliable interval (fewer than 5)."""


class _SamplingKeys(TypedDict):
    temperature: float
    top_p: float
    top_k: int
    """0: off."""
    seed: int
    """Seeds each prompt's sampled completion and its Monte Carlo walks."""
    samples: int
    """Monte Carlo walks per prompt."""
    processing: str
    """How both models' logits become probabilities: temperature, then top-k, then top-p."""
    reference: str
    """The z-lab/dflash commit whose sampling and rejection rule are followed."""
    estimator: str
    """`exact expectation given each prompt's sampled path`: what the other metrics hold."""
    ddtree: str
    """`not evaluated at T > 0`."""
    monte_carlo: MonteCarlo
    """A seeded check of the exact values: its interval is Monte Carlo error only, not the
    paths' noise (`interval` has that: docs/sampling.md "The intervals")."""


class SamplingRecord(_SamplingKeys, total=False):
    paths: int
    """Sampled completions per prompt; absent before --paths (one path per prompt)."""
    interval: PathsInterval
    """The interval for the live loop's τ: path noise and prompts (absent before --paths)."""


class Capped(_CappedKeys, total=False):
    tau_convention: str
    """`"zlab-07ebd93"`; absent in schema 2, whose `capped` was the schema-1 convention."""


class _MetricsKeys(TauBlock):
    block_size: int
    """B used for this evaluation."""
    tau_convention: str
    """`"zlab-live-loop"`: the round rules above."""
    histogram: dict[str, int | float]
    """`{"1": count, …, "B": count}` of round lengths."""
    per_position: list[PositionRate]
    """One row for each block position k = 1..B−1."""
    ddtree: dict[str, TauBlock]
    """For each budget b (`"4"`, …): the best-first tree of b nodes from the same drafter
    pass (see the DDTree paragraph above); same round rules."""
    capped: Capped
    """z-lab's current loop (commit 07ebd93db9f4, docs/harness-spec.md): rounds run while
    anchor + 1 < prompt length + `max_new_tokens` (none when the first completion token is a
    stop token), the verified block is min(B, what is left) slots, so the last block is
    drafted shortened, and a round's count is capped at the tokens left and cut after the
    first stop token; DDTree under the same end rules, its tree drafted from the shortened
    block. Its `committed_tokens` = completion tokens − 1 per prompt. Schema 1 and 2 capped
    the count without shortening the block."""
    incomplete_references: int
    """Prompts whose reference was too short to decide every round (a completion source that
    stopped early); should be 0, otherwise a warning names them."""


class Metrics(_MetricsKeys, total=False):
    sampling: SamplingRecord
    """T > 0 only (absent at T = 0): the sampling settings, the estimator and its Monte Carlo
    check. The other keys then hold expectations given the sampled paths, and `ddtree` is
    `{}` ([sampling.md](sampling.md) "In the results")."""

    conventions: dict[str, str]
    """`{name: what it is}` for `"zlab-live-loop"` (commit 7d2ea1e9828b) and
    `"zlab-07ebd93"` (commit 07ebd93db9f4), each naming the reference commit it follows;
    absent in schema 2."""


# --- per prompt, samples -----------------------------------------------------------------------


class Acceptance(TypedDict):
    hits: list[int | float]
    """Per block position k = 1..: rounds where slots < k were right and slot k too."""
    trials: list[int | float]
    """Per k: rounds where slots < k were right and slot k was checked."""


class PromptCache(TypedDict):
    completion: bool
    hidden_states: bool


class _PromptRowKeys(TypedDict):
    id: str
    prompt_tokens: int
    completion_tokens: int
    """What the live loop outputs: `max_new_tokens`, or up to and including the first stop
    token."""
    stopped: bool
    """The completion ends at a stop token."""
    reference_tokens: int
    """Completion + the tokens generated past its end."""
    rounds: int | float
    tau: float | None
    ddtree_tau: dict[str, float | None]
    """`{"4": τ, …}`."""
    tau_capped: float | None
    """τ in the `zlab-07ebd93` convention of `metrics.capped` (schema 2: the schema-1 one)."""
    cache: PromptCache
    """Whether the completion and the hidden states came from the cache."""


class PromptRow(_PromptRowKeys, total=False):
    dataset: str | None
    """The named set it came from, or null."""
    conversation: str
    """Id of its conversation's first turn; its own id for a single turn."""
    acceptance: Acceptance
    """Conditional acceptance counts per block position."""
    path_tau: list[float | None]
    """T > 0: E[τ | path] of each sampled path (the row's `tau` is their mean); absent
    before --paths and at T = 0."""


class _SampleRoundKeys(TypedDict):
    position: int
    """Completion index of the anchor."""
    anchor: str
    """The anchor token."""
    target: str
    """The target's next B−1 tokens."""
    draft: str
    """The drafter's greedy proposal for the same B−1 slots."""
    accepted: int
    """Draft tokens that matched the target's before the first that did not."""


class SampleRound(_SampleRoundKeys, total=False):
    target_tokens: list[str]
    """`target` token by token (absent in results written before it)."""
    draft_tokens: list[str]
    """`draft` token by token: the first `accepted` were accepted, the next one rejected."""


class _SampleKeys(TypedDict):
    id: str
    """The prompt's id."""
    completion_start: str
    """The first 4·B tokens of the completion."""
    rounds: list[SampleRound]
    """Up to 4 rounds of the vanilla walk, at the quartiles of the prompt's accepted counts
    (earlier results: the first 4), in walk order."""


class Sample(_SampleKeys, total=False):
    dataset: str
    """The prompt's named set (absent for plain prompts and earlier results)."""


# --- by_dataset --------------------------------------------------------------------------------


class Interval(TypedDict):
    value: float
    """The statistic on the prompts as they are (the overall values equal `metrics`)."""
    low: float | None
    """The 2.5th percentile over the resamples; null from a single unit."""
    high: float | None
    """The 97.5th percentile; null from a single unit."""


class GroupTau(TypedDict):
    tau_macro: Interval | None


class GroupPosition(TypedDict):
    position: int
    conditional: Interval | None
    """Σ hits / Σ trials."""


class Group(TypedDict):
    prompts: int
    """Prompts (turns) in the group."""
    units: int
    """Conversations resampled (prompts with rounds; = prompts without multi-turn sets)."""
    rounds: int | float
    tau_macro: Interval | None
    """Of τ macro (mean of per-prompt τ); null when undefined (no rounds)."""
    tau_pooled: Interval | None
    """Of τ pooled (Σ τ·rounds / Σ rounds)."""
    ddtree: dict[str, GroupTau]
    per_position: list[GroupPosition]


class BootstrapSettings(TypedDict):
    method: str
    unit: str
    resamples: int
    seed: int
    level: float


class ByDataset(TypedDict):
    bootstrap: BootstrapSettings
    """`{"method": "percentile", "unit": "conversation", "resamples": 2000, "seed": 0,
    "level": 0.95}`."""
    overall: Group
    """Every prompt."""
    datasets: dict[str, Group]
    """Each named set (empty for plain prompts)."""
