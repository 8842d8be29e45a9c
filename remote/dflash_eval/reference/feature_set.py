"""A feature set: one target's reference completions and hidden states, computed once where
they are right (a features host: GPU with `fla`, or float32 on CPU) for eval hosts to read.

On disk, SETDIR holds the harness's cache layout (cache.py), every entry keyed with the set's
`shared_key`, and `feature-set.json`, which says what the set holds and how it was made
(docs/results-schema.md, "Feature sets"):

    SETDIR/completions/<sha256>.json      SETDIR/hidden/<sha256>.safetensors
    SETDIR/features/<sha256>.json         SETDIR/feature-set.json

`feature-set.json` lists every other file with its size and sha256 (`files`); an eval
reads the entries through feature_files.VerifiedCache, which refuses one that differs.

`features` builds it in SETDIR.partial and renames that to SETDIR when complete, so SETDIR
exists only whole. The partial holds `inputs.json`: an interrupted build is resumed by a
re-run with the same inputs (entries are content-keyed, so the ones written stay valid) and
replaced by a run with other inputs. `eval --features SETDIR` reads the set and never
writes to it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.prompts import Prompt
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.reference.feature_files import VerifiedCache, file_records

FORMAT = 1
MANIFEST = "feature-set.json"
PARTIAL_SUFFIX = ".partial"
PARTIAL_INPUTS = "inputs.json"
# The manifest fields that name a set's inputs: equal ones make a re-run a no-op.
INPUT_FIELDS = (
    "format",
    "shared_key",
    "target",
    "layer_ids",
    "block_size",
    "max_new_tokens",
    "thinking",
    "prompts",
    "completions",
)
SAMPLE_BYTES = 1 << 20  # per window of a weight file in the content fingerprint
REMAKE = "re-run `fab extract-features` for this run's target, prompts and --max-new-tokens"


@dataclass(frozen=True)
class FeatureSet:
    """A complete feature set, as `eval --features` reads it."""

    path: Path
    manifest: dict[str, Any]
    manifest_sha256: str  # of the feature-set.json bytes read: the workstation checks it

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def dtype(self) -> str:
        return self.manifest["provenance"]["dtype"]

    def features_record(self) -> dict[str, Any]:
        """results["features"]: where and how the set was computed, under which name, and
        the sha256 of the feature-set.json this run read."""
        provenance = {**self.manifest["provenance"], "source": "feature set"}
        return {
            **provenance,
            "fidelity": self.manifest["fidelity"],
            "set": self.name,
            "set_sha256": self.manifest_sha256,
        }

    def check_fits(
        self,
        identity: dict[str, Any],
        drafters: dict[str, DrafterConfig],
        max_new_tokens: int,
        thinking: bool,
    ) -> str:
        """Refuse a run the set cannot serve exactly (each check names the fix). Returns how
        the target was matched: `fingerprint`, or `content` for another host's copy."""
        made_for = self.manifest["target"]
        match = "fingerprint"
        if made_for["fingerprint"] != identity["fingerprint"]:
            match = "content"
            if made_for.get("content_fingerprint") != content_fingerprint(identity):
                raise HarnessError(
                    f"Feature set {self.path} was computed for target {made_for['name']!r} "
                    f"with fingerprint {made_for['fingerprint'][:12]}…, but this run's --target "
                    f"{identity['path']} has {identity['fingerprint'][:12]}…, and its files' "
                    "contents differ too (config, tokenizer or weights). Point --target at the "
                    f"target the set was made for, or {REMAKE}."
                )
        layers, block = self.manifest["layer_ids"], self.manifest["block_size"]
        for role, config in drafters.items():
            missing = sorted(set(config.target_layer_ids) - set(layers))
            if missing:
                raise HarnessError(
                    f"The {role} reads target layers {list(config.target_layer_ids)}; feature "
                    f"set {self.path} holds layers {layers} only (missing {missing}). Extract "
                    "a set whose --layers include all of them."
                )
            if config.block_size > block:
                raise HarnessError(
                    f"The {role}'s block size {config.block_size} exceeds the feature set's "
                    f"{block} ({self.path}): its references stop {block} tokens past each "
                    f"completion, too few to score the last rounds. Extract a set with "
                    f"--block-size {config.block_size} or more, or evaluate with --block-size "
                    f"{block} or less."
                )
        wanted = {"max_new_tokens": max_new_tokens, "thinking": thinking}
        for field, value in wanted.items():
            if self.manifest[field] != value:
                raise HarnessError(
                    f"Feature set {self.path} was made with {field} {self.manifest[field]}, "
                    f"this run asks for {value}: its completions cannot serve this run. Run "
                    f"with the set's value, or {REMAKE} and --thinking."
                )
        return match

    def cache(self) -> VerifiedCache:
        """The set's entries, each verified against the manifest's `files` as it is read."""
        files = self.manifest.get("files")
        if not isinstance(files, dict):
            raise HarnessError(
                f"Feature set {self.path} lists no files with their sha256 (an older harness "
                "made it), so what it holds cannot be verified. Remove it on the features and "
                "eval hosts (`fab prune --features`) and run `fab extract-features` again."
            )
        return VerifiedCache(self.path, files)

    def missing(self, prompt: Prompt, what: str) -> HarnessError:
        return HarnessError(
            f"Prompt {prompt.id!r}: no {what} in feature set {self.path} (the set was made for "
            f"{self.manifest['prompts']['count']} other prompts, or with other settings). "
            f"Computing it here would mix features of two provenances in one run: {REMAKE}."
        )


def content_fingerprint(identity: dict[str, Any]) -> str:
    """The target's identity across hosts. target_identity's fingerprint holds the weight
    files' mtimes (so that a file rewritten in place is a miss), and those differ between two
    hosts' copies of the same files. This one keeps the sha256 of the config and tokenizer
    files, and of each weight file its name, size, header hash and the sha256 of three
    windows of its bytes (start, middle, end): weights of the same shapes with other values,
    a fine-tune, differ there, for 3 MiB read per file instead of hashing tens of GB."""
    root = Path(identity["path"])
    files = {}
    for name, facts in identity["files"].items():
        kept = {key: value for key, value in facts.items() if key != "mtime_ns"}
        if "header_sha256" in facts:
            kept["sample_sha256"] = _sampled_sha256(root / name, facts["size"])
        files[name] = kept
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _sampled_sha256(file: Path, size: int) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        for start in (0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)):
            handle.seek(start)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def read_feature_set(path: Path) -> FeatureSet:
    """The complete set at `path`, or an error that says what is wrong with it."""
    path = Path(path)
    manifest_file = path / MANIFEST
    if not path.is_dir():
        partial = partial_path(path).is_dir()
        state = "only as an incomplete build (.partial)" if partial else "not"
        raise HarnessError(
            f"--features {path}: the feature set exists {state} on this host. Run `fab "
            "extract-features` (it relays complete sets to every eval host), then run again."
        )
    if not manifest_file.is_file():
        raise HarnessError(
            f"--features {path} has no {MANIFEST}: not a complete feature set. Remove it and "
            "run `fab extract-features` again."
        )
    try:
        data = manifest_file.read_bytes()  # hashed as read: the run records what it used
        manifest = json.loads(data)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HarnessError(
            f"--features {path}: {MANIFEST} cannot be read ({error}). Remove the set and run "
            "`fab extract-features` again."
        ) from None
    _check_manifest(manifest, manifest_file)
    return FeatureSet(path, manifest, hashlib.sha256(data).hexdigest())


def _check_manifest(manifest: Any, where: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise HarnessError(
            f"{where}: feature-set format {found!r}, this harness reads format {FORMAT}. "
            "Extract the set again with this harness (`fab extract-features`)."
        )
    needed = (*INPUT_FIELDS, "provenance", "fidelity", "entries")
    absent = [name for name in needed if name not in manifest]
    if absent:
        raise HarnessError(
            f"{where} lacks {absent}: the set is corrupt. Remove it and run "
            "`fab extract-features` again."
        )


def partial_path(setdir: Path) -> Path:
    return setdir.with_name(setdir.name + PARTIAL_SUFFIX)


def set_inputs(manifest: dict[str, Any]) -> dict[str, Any]:
    return {name: manifest.get(name) for name in INPUT_FIELDS}


def is_complete_and_same(setdir: Path, inputs: dict[str, Any]) -> bool:
    """True: SETDIR is a complete set of these inputs (nothing to do). An existing SETDIR
    with other inputs, or not a set at all, is an error: it is never overwritten."""
    if not setdir.exists():
        return False
    if not (setdir / MANIFEST).is_file():
        raise HarnessError(
            f"--out {setdir} exists and is not a complete feature set (no {MANIFEST}). It is "
            "never overwritten: choose another --out, or remove it first."
        )
    found = set_inputs(read_feature_set(setdir).manifest)
    if found == inputs:
        return True
    differing = [name for name in INPUT_FIELDS if found[name] != inputs[name]]
    raise HarnessError(
        f"{setdir} is a complete feature set made with other inputs (differing: {differing}). "
        "A set is never overwritten: choose another --out, or remove it first."
    )


def open_partial(setdir: Path, inputs: dict[str, Any], progress: Progress) -> Path:
    """SETDIR.partial, resumed when an interrupted build left it with the same inputs, else
    made afresh."""
    partial = partial_path(setdir)
    recorded = partial / PARTIAL_INPUTS
    if partial.is_dir():
        try:
            same = json.loads(recorded.read_text()) == inputs
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            same = False
        if same:
            progress.say(f"Resuming the interrupted build in {partial}")
            return partial
        progress.say(f"Replacing {partial}: left by a build with other inputs")
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    recorded.write_text(json.dumps(inputs, indent=1))
    return partial


def complete(partial: Path, setdir: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest, with every file's size and sha256, and make the set appear whole,
    in one rename."""
    (partial / PARTIAL_INPUTS).unlink()
    temp = partial / (MANIFEST + PARTIAL_SUFFIX)
    files = file_records(partial, {MANIFEST, temp.name})
    temp.write_text(json.dumps({**manifest, "files": files}, indent=1) + "\n")
    temp.replace(partial / MANIFEST)
    partial.rename(setdir)
