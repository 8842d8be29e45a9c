"""`export`: a drafter checkpoint (any format the loaders read) → a Hugging Face drafter
directory laid out as z-lab's released drafters, which SGLang's `--speculative-draft-model-path`
and `from_pretrained` load: config.json (a Qwen3 config with block_size, num_target_layers
and dflash_config.{target_layer_ids, mask_token_id}, only keys contract/config_keys.py knows)
and model.safetensors (the drafter's own parameters as stored, without the target copies some
trainers keep). Every setting is resolved exactly as `eval` resolves it (the checkpoint's
config, --drafter-config, the profile, the flags, the default rules it is allowed), so
evaluating the directory gives the checkpoint's numbers. dflash_export.json records the
source, its sha256 and where each setting came from; an existing output directory is replaced
only when that record says export wrote it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.weights import EXPORT_MARKER
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.profile import read_profile
from dflash_eval.run.extract import save_tensors
from dflash_eval.run.own_dirs import promote, start_partial
from dflash_eval.run.results import file_identity, utc_now
from dflash_eval.target.config import read_target_config


@dataclass(frozen=True)
class ExportOptions:
    checkpoint: Path
    target: Path
    out: Path
    drafter_config: Path | None = None
    drafter_profile: Path | None = None
    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    accept_default: tuple[str, ...] = ()
    pickle_policy: PicklePolicy = field(default_factory=PicklePolicy)


def export_drafter(options: ExportOptions) -> dict[str, Any]:
    """Write the drafter directory; return a summary (out, parameters, step, settings)."""
    shape = read_target_config(options.target).shape
    loaded = load_drafter(
        options.checkpoint,
        shape,
        config_file=options.drafter_config,
        profile=read_profile(options.drafter_profile) if options.drafter_profile else None,
        block_size=options.block_size,
        mask_token_id=options.mask_token_id,
        target_layer_ids=options.target_layer_ids,
        accept_default=options.accept_default,
        pickle_policy=options.pickle_policy,
    )
    if loaded.config.dflash2 is not None:
        raise HarnessError(
            f"{options.checkpoint} is a DFlash-2 drafter; export writes plain DFlash drafters "
            "(the layout SGLang's DFLASH algorithm serves). Evaluate it with run-eval instead."
        )
    source = loaded.source
    parameters = {k: v for k, v in source.state_dict.items() if k not in loaded.ignored_parameters}
    config = loaded.config.to_hf_dict()
    config["torch_dtype"] = str(next(iter(parameters.values())).dtype).removeprefix("torch.")
    out_dir = Path(options.out)
    partial = start_partial(out_dir, EXPORT_MARKER, "export")
    save_tensors(parameters, partial / "model.safetensors")
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    identity = file_identity(source.files, verify=False)
    record = {
        "source": str(options.checkpoint),
        "source_kind": source.kind,
        "source_size_bytes": identity["size_bytes"],
        "source_sha256": identity["sha256"],
        "step": source.step,
        "config_source": loaded.config_source,
        "settings": loaded.provenance(),
        "set_aside": loaded.ignored_parameters,
        "created_at": utc_now(),
    }
    (partial / EXPORT_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    promote(partial, out_dir, EXPORT_MARKER, "export")
    return {
        "out": str(out_dir),
        "parameters": len(parameters),
        "step": source.step,
        "block_size": loaded.config.block_size,
        "source_sha256": identity["sha256"],
        "config_source": loaded.config_source,
    }
