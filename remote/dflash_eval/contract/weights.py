"""What the weights of a training checkpoint are: where its state dict lives, which of its
entries are metadata (all others, optimizer state and the like, are dropped), which name
prefixes are wrappers, and the marker files of the extracted and exported formats.

Stdlib only: the workstation sends these to the trainer's strip script
(dflash_ops/staging/strip_script.py), so that a checkpoint stripped at the source holds what
the harness reads (drafter/checkpoint.py).
"""

EXTRACT_MARKER = "dflash_extract.json"
# Beside a Hugging Face drafter directory that `export` wrote (its provenance).
EXPORT_MARKER = "dflash_export.json"
# Wrappers that training code puts in front of parameter names.
PREFIXES = ("module.", "_orig_mod.", "draft_model.", "drafter.", "model.")
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model")
# Checkpoint entries read for identity/config; everything else (optimizer...) is dropped.
METADATA_KEYS = ("config", "model_config", "draft_config", "args", "step", "global_step")
# Frozen copies of the target's parts that some trainers store; the harness uses the
# target's own, so these are set aside (and reported), not loaded.
BORROWED = ("embed_tokens.weight", "lm_head.weight")
