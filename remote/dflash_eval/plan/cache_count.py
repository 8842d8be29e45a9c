"""What `eval` would find in the cache (for `plan`): every entry looked up by the key `eval`
would use, without computing anything. Completions are read (they are small, and a prompt's
completion is part of its hidden states' key and of a follow-up turn's prompt); of hidden
states only the stored key is looked up. At T > 0 every sampled path of a prompt is an entry
of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.prompts import Prompt
from dflash_eval.plan.drafter import DrafterFacts
from dflash_eval.reference import cache_keys
from dflash_eval.reference.cache import DiskCache
from dflash_eval.reference.conversation import Conversations
from dflash_eval.reference.sequence import Sequence
from dflash_eval.run.prepared import PreparedRun
from dflash_eval.run.results import library_versions
from dflash_eval.target.dtype import DtypeChoice, dtype_key
from dflash_eval.target.features import fidelity_needed, kernel_record
from dflash_eval.target.files import load_tokenizer, stop_token_ids, target_identity


@dataclass(frozen=True)
class PromptCount:
    prompt_tokens: int | None  # None: not known yet (a later turn after an uncached one)
    reference_tokens: int | None  # None: the completion is not cached
    hidden_hit: bool = False


@dataclass
class CacheCount:
    enabled: bool
    total: int
    unknown: int = 0  # prompts whose keys cannot be known yet
    features_record: str = "unknown"  # "cached" | "missing" | "not needed" | "unknown"
    paths: int = 1  # entries per prompt: its sampled paths at T > 0
    prompts: list[PromptCount] = field(default_factory=list)

    @property
    def completion_hits(self) -> int:
        return sum(p.reference_tokens is not None for p in self.prompts)

    @property
    def hidden_hits(self) -> int:
        return sum(p.hidden_hit for p in self.prompts)

    def record(self) -> dict[str, Any]:
        known = self.total - self.unknown
        return {
            "enabled": self.enabled,
            "completions": {"hits": self.completion_hits, "total": self.total},
            "hidden_states": {"hits": self.hidden_hits, "total": self.total},
            "unknown": self.unknown,
            "completions_to_compute": known - self.completion_hits,
            "hidden_states_to_compute": known - self.hidden_hits,
            "features_record": self.features_record,
            "paths": self.paths,
        }


def count_cache(
    run: PreparedRun,
    config: dict[str, Any],
    choice: DtypeChoice | None,
    drafter: DrafterFacts,
    reference: DrafterFacts | None,
    completions: dict[str, Any],
) -> CacheCount:
    """Look every entry up by the key `eval` would use. `completions`: where they would come
    from (completions_record: the server's answer is part of their key). Unknown, and
    estimated as if nothing were cached, until the dtype and both drafters' settings are."""
    paths = run.paths
    count = CacheCount(run.options.cache_dir is not None, len(run.prompts) * paths, paths=paths)
    drafters = [d for d in (drafter, reference) if d is not None]
    if choice is None or not all(d.known for d in drafters):
        count.unknown = count.total
        count.prompts = [PromptCount(None, None) for _ in range(count.total)]
        return count
    extra = max(d.block_size or 0 for d in drafters)
    layer_ids = sorted({i for d in drafters for i in d.layer_ids or []})
    lookups = _lookups(run, config, choice, completions, extra, layer_ids)
    for path in range(paths):
        lookups.count_path(count, path)
    if fidelity_needed(config, layer_ids, choice.name) is not None:
        count.features_record = "not needed"
    return count


@dataclass
class _Lookups:
    """The cache as `eval` would look it up: the parts every key of the run shares, and the
    conversations (a follow-up turn's prompt holds the reply to the turn before)."""

    run: PreparedRun
    shared: dict[str, Any]
    source: str
    stops: list[int]
    extra: int  # completion tokens past the stop: the largest drafter block
    layer_ids: list[int]
    cache: DiskCache
    conversations: Conversations

    def count_path(self, count: CacheCount, path: int) -> None:
        """Each prompt on one sampled path (greedy: the only one) counted into `count`."""
        answered: set[str] = set()
        for index, prompt in enumerate(self.run.prompts):
            if prompt.follows is not None and prompt.follows not in answered:
                count.unknown += 1  # its prompt holds the reply to an uncached turn
                count.prompts.append(PromptCount(None, None))
            elif self._count_prompt(count, prompt, path, first=(index, path) == (0, 0)):
                answered.add(prompt.id)

    def _count_prompt(self, count: CacheCount, prompt: Prompt, path: int, first: bool) -> bool:
        """One prompt's entries looked up; whether its completion is cached. The features
        record is looked up once, for the first prompt."""
        options, sampling = self.run.options, self.run.sampling
        seq = Sequence(prompt, self.conversations.encode(prompt, path), path)
        key = cache_keys.completion_key(
            self.shared,
            self.source,
            seq.prompt_ids,
            options.max_new_tokens,
            self.stops,
            self.extra,
            sampling.key(path) if sampling.active else None,
        )
        reference_tokens = self.cache.get_completion(key)
        if reference_tokens is None:
            count.prompts.append(PromptCount(len(seq.prompt_ids), None))
            return False
        seq.take_reference(reference_tokens, options.max_new_tokens, self.stops)
        self.conversations.replied(prompt, seq.completion, path)
        hit = self.cache.has_hidden(cache_keys.hidden_key(self.shared, seq.tokens, self.layer_ids))
        count.prompts.append(PromptCount(len(seq.prompt_ids), len(reference_tokens), hit))
        if first:
            first_key = cache_keys.features_key(self.shared, seq.tokens, self.layer_ids)
            found = self.cache.get_record("features", first_key) is not None
            count.features_record = "cached" if found else "missing"
        return True


def _lookups(
    run: PreparedRun,
    config: dict[str, Any],
    choice: DtypeChoice,
    completions: dict[str, Any],
    extra: int,
    layer_ids: list[int],
) -> _Lookups:
    """The key parts `eval` derives from the target, its dtype and where the completions
    come from (at T > 0: sampled locally)."""
    options = run.options
    target = Path(options.target)
    tokenizer = load_tokenizer(target)
    stops = stop_token_ids(target, tokenizer)
    shared = cache_keys.shared_key(
        target_identity(target)["fingerprint"],
        dtype_key(choice.name),
        library_versions(),
        options.device,  # the run's (prepared): part of every key
        kernel_record(config),
    )
    source = (
        cache_keys.LOCAL_SAMPLED
        if run.sampling.active
        else cache_keys.completion_source(
            options.sglang_url, completions.get("sglang_model"), completions.get("sglang_version")
        )
    )
    cache = DiskCache(options.cache_dir)
    conversations = Conversations(tokenizer, options.thinking, options.max_new_tokens)
    return _Lookups(run, shared, source, stops, extra, layer_ids, cache, conversations)
