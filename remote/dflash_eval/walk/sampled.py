"""τ at T > 0 along one sampled target path: exactly (dynamic programming over anchors) and
as a seeded Monte Carlo mean with its interval (docs/sampling.md has the argument).

Along the committed path y, the round at anchor s accepts slot k, given slots < k were
accepted, with probability r[s, k] = min(1, q_{s,k}(y[s+k]) / p(y[s+k])) (q the drafter's
processed distribution for slot k of the block at s, p the target's at that position). Given
the path, the slots' acceptances are independent with these probabilities, and so are the
rounds: the walk over anchors is a Markov chain whose round at s commits n = acc+1 tokens
with probability r[s,1]…r[s,n-1]·(1 − r[s,n]) (the last slot's product alone for n = B).
Slots past the end of the known path (NaN in a table) count as r = 0, as unknown tokens are
never accepted at T = 0 either.

The rules of a walk are metrics.walk's: rounds start while the anchor is below `limit`,
the round that reaches `stop` is the last, `cap` bounds what a round commits (the capped
convention), and at most `max_rounds` rounds run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dflash_eval.contract.schema_metrics import (
    MeanInterval,
    Metrics,
    MonteCarlo,
    PositionRate,
    SamplingRecord,
    TauBlock,
)
from dflash_eval.contract.student import PathValue, prompt_interval
from dflash_eval.walk.metrics import TAU_CONVENTION, Span
from dflash_eval.walk.sampling import generator, stream_seed
from dflash_eval.walk.sampling_settings import Sampling

if TYPE_CHECKING:
    from dflash_eval.walk.predict import SampledPredictor

LEVEL = 0.95
Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile


@dataclass(frozen=True)
class WalkRule:
    first: int  # the first anchor (the prompt length)
    limit: int  # a round starts only below it
    stop: int | None = None  # the walk ends once an anchor reaches it
    cap: int | None = None  # a round at anchor a commits at most cap − a tokens
    max_rounds: int | None = None

    def ended(self, anchor: int) -> bool:
        return anchor >= self.limit or (self.stop is not None and anchor >= self.stop)


@dataclass
class Expectation:
    """Expected values of one prompt's walk given its path."""

    tau: float | None  # E[committed / rounds], None when no round runs
    rounds: float
    tokens: float
    histogram: list[float]  # expected rounds committing n = 1..B tokens
    hits: list[float]  # per slot k: expected rounds whose slots ≤ k were all accepted
    trials: list[float]  # per slot k: expected rounds whose slots < k were, slot k known
    ratio_sums: list[float]  # per slot k: Σ over anchors of visit probability × r[s, k]
    visits: list[float]  # per slot k: Σ of the visit probabilities where slot k is known


@dataclass
class SampledWalk:
    """One prompt at T > 0: both conventions exactly, and the Monte Carlo walks."""

    main: Expectation
    capped: Expectation
    mc_tokens: list[int] = field(default_factory=list)
    mc_rounds: list[int] = field(default_factory=list)
    reference_complete: bool = True


def length_probabilities(ratios: torch.Tensor) -> torch.Tensor:
    """[B-1] acceptance probabilities → [B] P(the round commits n = 1..B tokens)."""
    through = torch.cat([torch.ones(1, dtype=ratios.dtype), torch.cumprod(ratios, dim=0)])
    return through * torch.cat([1 - ratios, torch.ones(1, dtype=ratios.dtype)])


def expected_walk(table: torch.Tensor, rule: WalkRule) -> Expectation:
    """table: [anchors from rule.first, B-1] acceptance probabilities (NaN past the path).

    Forward over anchors of P(anchor reached after R rounds); the walk's end is reached by
    a round from below, so every terminal state's (tokens, rounds) is known exactly."""
    slots = table.shape[1]
    starts = max(rule.limit - rule.first, 0)
    most = starts if rule.max_rounds is None else min(starts, rule.max_rounds)
    mass = torch.zeros(starts + slots + 2, most + 2, dtype=torch.float64)
    final = torch.zeros_like(mass)
    stats = _Stats(slots)
    if starts:
        mass[0, 0] = 1.0
    for offset in range(starts):
        visit = float(mass[offset].sum())
        if visit == 0:
            continue
        known = ~torch.isnan(table[offset])
        ratios = table[offset].double().nan_to_num(0.0)
        probs = length_probabilities(ratios)
        stats.add(visit, ratios, known)
        anchor = rule.first + offset
        if rule.cap is not None:  # lengths above the cap commit cap − anchor tokens
            room = rule.cap - anchor
            probs = torch.cat([probs[: room - 1], probs[room - 1 :].sum().reshape(1)])
        shifted = torch.cat([torch.zeros(1, dtype=torch.float64), mass[offset, :-1]])
        for length, chance in enumerate(probs.tolist(), start=1):
            if chance == 0:
                continue
            reached = offset + length
            if rule.ended(anchor + length):
                final[reached] += shifted * chance
                continue
            mass[reached] += shifted * chance
            if rule.max_rounds is not None:  # states that used up the rounds stop here
                final[reached, rule.max_rounds] += mass[reached, rule.max_rounds]
                mass[reached, rule.max_rounds] = 0
    tokens = torch.arange(final.shape[0], dtype=torch.float64)[:, None]
    rounds = torch.arange(final.shape[1], dtype=torch.float64)[None, :]
    return Expectation(
        tau=float((final[:, 1:] * tokens / rounds[:, 1:]).sum()) if starts else None,
        rounds=float((final * rounds).sum()),
        tokens=float((final * tokens).sum()),
        **stats.as_dict(),
    )


class _Stats:
    """Visit-weighted per-round statistics (the histogram and the per-slot rates)."""

    def __init__(self, slots: int) -> None:
        self.histogram = torch.zeros(slots + 1, dtype=torch.float64)
        self.hits = torch.zeros(slots, dtype=torch.float64)
        self.trials = torch.zeros(slots, dtype=torch.float64)
        self.ratio_sums = torch.zeros(slots, dtype=torch.float64)
        self.visits = torch.zeros(slots, dtype=torch.float64)

    def add(self, visit: float, ratios: torch.Tensor, known: torch.Tensor) -> None:
        self.histogram += visit * length_probabilities(ratios)
        through = torch.cumprod(ratios, dim=0)
        before = torch.cat([torch.ones(1, dtype=ratios.dtype), through[:-1]])
        self.hits += visit * through
        self.trials += visit * before * known
        self.ratio_sums += visit * ratios * known
        self.visits += visit * known

    def as_dict(self) -> dict[str, list[float]]:
        names = ("histogram", "hits", "trials", "ratio_sums", "visits")
        return {name: getattr(self, name).tolist() for name in names}


def monte_carlo(
    table: torch.Tensor, rule: WalkRule, samples: int, rng: torch.Generator
) -> tuple[list[int], list[int]]:
    """(committed tokens, rounds) of `samples` walks, each slot accepted with its r."""
    ratios = table.double().nan_to_num(0.0)
    anchors = torch.full((samples,), rule.first, dtype=torch.long)
    rounds = torch.zeros(samples, dtype=torch.long)
    active = torch.full((samples,), rule.first < rule.limit)
    while bool(active.any()):
        walking = active.nonzero()[:, 0]
        drawn = torch.rand(len(walking), ratios.shape[1], generator=rng, dtype=torch.float64)
        accepted = (drawn < ratios[anchors[walking] - rule.first]).long().cumprod(dim=1).sum(dim=1)
        lengths = accepted + 1
        if rule.cap is not None:
            lengths = torch.minimum(lengths, rule.cap - anchors[walking])
        anchors[walking] += lengths
        rounds[walking] += 1
        ended = anchors[walking] >= rule.limit
        if rule.stop is not None:
            ended |= anchors[walking] >= rule.stop
        if rule.max_rounds is not None:
            ended |= rounds[walking] >= rule.max_rounds
        active[walking] = ~ended
    return (anchors - rule.first).tolist(), rounds.tolist()


def walk_sampled(
    table: torch.Tensor,
    span: Span,
    known_tokens: int,
    sampling: Sampling,
    rng: torch.Generator,
    max_rounds: int | None = None,
) -> SampledWalk:
    """Both conventions of one prompt (metrics.walk_prompt's rules) and its Monte Carlo walks.

    table: [anchors span.first_anchor.., B-1], covering every anchor below the main limit;
    known_tokens: prompt + reference length."""
    limit = min(span.limit, known_tokens - 1)
    main = WalkRule(span.first_anchor, limit, span.stop, None, max_rounds)
    capped_last = min(span.end, known_tokens) - 1
    capped = WalkRule(span.first_anchor, capped_last, None, capped_last, max_rounds)
    tokens, rounds = monte_carlo(table, main, sampling.samples, rng)
    return SampledWalk(
        expected_walk(table, main),
        expected_walk(table, capped),
        tokens,
        rounds,
        reference_complete=known_tokens >= span.needed_tokens(table.shape[1] + 1),
    )


class SampledPath(Protocol):
    """One prompt's sampled reference as its walks read it (reference/pipeline.py's
    Sequence is one)."""

    prompt_ids: list[int]
    path: int  # which of the prompt's sampled completions
    span: Span | None
    target_probs: list[float]  # p of each reference token

    @property
    def tokens(self) -> list[int]: ...


def walk_sequence(
    predictor: SampledPredictor,
    seq: SampledPath,
    sampling: Sampling,
    max_rounds: int | None = None,
) -> SampledWalk:
    """One prompt's walks from its predictor, the Monte Carlo ones seeded per prompt."""
    assert seq.span is not None, "references are made before the walks"
    predictor.follow(sampling, seq.target_probs)
    rng = generator(stream_seed(sampling.seed, "walks", seq.prompt_ids, seq.path))
    table = predictor.table(predictor.last_anchor)
    return walk_sampled(table, seq.span, len(seq.tokens), sampling, rng, max_rounds)


def prompt_columns(walked: Sequence[SampledWalk]) -> dict[str, Any]:
    """A per-prompt row's metric columns at T > 0 (as run/record.py's at T = 0): expectations
    given each of the prompt's paths, averaged over them; `path_tau` lists each path's τ."""
    count = len(walked)
    main = [w.main for w in walked]
    return {
        "acceptance": {
            "hits": [sum(column) / count for column in zip(*(e.hits for e in main), strict=True)],
            "trials": [
                sum(column) / count for column in zip(*(e.trials for e in main), strict=True)
            ],
        },
        "rounds": sum(e.rounds for e in main) / count,
        "tau": _mean([e.tau for e in main]),
        "ddtree_tau": {},
        "tau_capped": _mean([w.capped.tau for w in walked]),
        "path_tau": [e.tau for e in main],
    }


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summarize_sampled(
    walks: Sequence[SampledWalk],
    block_size: int,
    sampling: Sampling,
    units: Sequence[tuple[str, str]],
) -> Metrics:
    """The metrics block at T > 0 (schema_metrics.Metrics): the T = 0 block's keys, holding
    expectations given the sampled paths (counts per prompt set: summed over prompts,
    averaged over paths), and the `sampling` block with the interval (contract/student.py).

    units: each walk's (prompt id, conversation id)."""
    main = [w.main for w in walks]
    paths = sampling.paths
    prompts = [prompt for prompt, _ in units]
    per_position = []
    for k in range(block_size - 1):
        hits, trials = _total(main, "hits", k) / paths, _total(main, "trials", k) / paths
        sums, visits = _total(main, "ratio_sums", k), _total(main, "visits", k)
        per_position.append(
            PositionRate(
                position=k + 1,
                conditional=hits / trials if trials else None,
                unconditional=sums / visits if visits else None,
                conditional_rounds=trials,
                rounds=visits / paths,
            )
        )
    histogram = [sum(e.histogram[n] for e in main) / paths for n in range(block_size)]
    exact = _exact_block(main, prompts, paths)
    return Metrics(
        block_size=block_size,
        tau_convention=TAU_CONVENTION,
        tau_macro=exact["tau_macro"],
        tau_pooled=exact["tau_pooled"],
        rounds=exact["rounds"],
        committed_tokens=exact["committed_tokens"],
        histogram={str(n + 1): count for n, count in enumerate(histogram)},
        per_position=per_position,
        ddtree={},
        capped={**_exact_block([w.capped for w in walks], prompts, paths), "ddtree": {}},
        incomplete_references=len(
            {p for p, w in zip(prompts, walks, strict=True) if not w.reference_complete}
        ),
        sampling=SamplingRecord(
            **sampling.record(),
            estimator="exact expectation given each prompt's sampled path",
            ddtree="not evaluated at T > 0",
            monte_carlo=_monte_carlo_block(walks, sampling.samples),
            interval=prompt_interval(
                [
                    PathValue(prompt, unit, e.tau, e.tokens, e.rounds)
                    for (prompt, unit), e in zip(units, main, strict=True)
                ],
                paths,
            ),
        ),
    )


def _total(expectations: Sequence[Expectation], name: str, k: int) -> float:
    return sum(getattr(e, name)[k] for e in expectations)


def _exact_block(expectations: Sequence[Expectation], prompts: list[str], paths: int) -> TauBlock:
    """τ macro: the mean over prompts of each prompt's mean over its paths; counts: per
    prompt set (the sum over paths / paths)."""
    by_prompt: dict[str, list[float]] = {}
    for prompt, e in zip(prompts, expectations, strict=True):
        if e.tau is not None:
            by_prompt.setdefault(prompt, []).append(e.tau)
    means = [sum(taus) / len(taus) for taus in by_prompt.values()]
    rounds = sum(e.rounds for e in expectations) / paths
    tokens = sum(e.tokens for e in expectations) / paths
    return TauBlock(
        tau_macro=sum(means) / len(means) if means else None,
        tau_pooled=tokens / rounds if rounds else None,
        rounds=rounds,
        committed_tokens=tokens,
    )


def _monte_carlo_block(walks: Sequence[SampledWalk], samples: int) -> MonteCarlo:
    """Per sample, τ over all prompts' paths (macro and pooled); their mean and a normal
    interval."""
    walked = [w for w in walks if w.main.tau is not None]
    macro, pooled = [], []
    for j in range(samples if walked else 0):
        macro.append(sum(w.mc_tokens[j] / w.mc_rounds[j] for w in walked) / len(walked))
        pooled.append(sum(w.mc_tokens[j] for w in walked) / sum(w.mc_rounds[j] for w in walked))
    return MonteCarlo(
        samples=samples,
        level=LEVEL,
        method="normal: mean ± z·sd/√samples",
        tau_macro=mean_interval(macro),
        tau_pooled=mean_interval(pooled),
    )


def mean_interval(values: Sequence[float]) -> MeanInterval | None:
    """The mean and its 95 % normal interval (None for fewer than two values)."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = Z_95 * spread / math.sqrt(len(values))
    return MeanInterval(value=mean, low=mean - half, high=mean + half)
