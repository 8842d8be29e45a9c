"""The numbers of the results JSON as types: metrics, per-prompt rows, decoded samples,
confidence intervals, throughput (the provenance around them is in schema.py, which says how
these types are used and documented). Stdlib only.
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
    rounds: int
    committed_tokens: int
    """The sum of round lengths (may exceed the completion tokens: last rounds run past the
    end)."""


class PositionRate(TypedDict):
    position: int
    """k = 1..B−1."""
    conditional: float | None
    """P(slot k correct | slots < k correct); null when no round qualifies."""
    unconditional: float | None
    """P(slot k correct)."""
    conditional_rounds: int
    rounds: int
    """Rounds where slot k was checked: all of them."""


class Capped(TauBlock):
    ddtree: dict[str, TauBlock]


class Metrics(TauBlock):
    block_size: int
    """B used for this evaluation."""
    tau_convention: str
    """`"zlab-live-loop"`: the round rules above."""
    histogram: dict[str, int]
    """`{"1": count, …, "B": count}` of round lengths."""
    per_position: list[PositionRate]
    """One row for each block position k = 1..B−1."""
    ddtree: dict[str, TauBlock]
    """For each budget b (`"4"`, …): the best-first tree of b nodes from the same drafter
    pass (see the DDTree paragraph above); same round rules."""
    capped: Capped
    """The schema-1 convention, kept for comparison with older runs: rounds start at the
    first completion token and end at its last one, the last round commits at most the
    tokens left; its `committed_tokens` = completion tokens − 1 per prompt."""
    incomplete_references: int
    """Prompts whose reference was too short to decide every round (a completion source that
    stopped early); should be 0, otherwise a warning names them."""


# --- per prompt, samples -----------------------------------------------------------------------


class Acceptance(TypedDict):
    hits: list[int]
    """Per block position k = 1..: rounds where slots < k were right and slot k too."""
    trials: list[int]
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
    rounds: int
    tau: float | None
    ddtree_tau: dict[str, float | None]
    """`{"4": τ, …}`."""
    tau_capped: float | None
    """τ in the schema-1 convention."""
    cache: PromptCache
    """Whether the completion and the hidden states came from the cache."""


class PromptRow(_PromptRowKeys, total=False):
    dataset: str | None
    """The named set it came from, or null."""
    conversation: str
    """Id of its conversation's first turn; its own id for a single turn."""
    acceptance: Acceptance
    """Conditional acceptance counts per block position."""


class SampleRound(TypedDict):
    position: int
    """Completion index of the anchor."""
    anchor: str
    """The anchor token."""
    target: str
    """The target's next B−1 tokens."""
    draft: str
    """The drafter's greedy proposal for the same B−1 slots."""
    accepted: int


class Sample(TypedDict):
    id: str
    """The prompt's id."""
    completion_start: str
    """The first 4·B tokens of the completion."""
    rounds: list[SampleRound]
    """The first 4 rounds of the vanilla walk."""


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
    rounds: int
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
