"""What the drafter is measured against: per prompt, the target's reference completion (local
or SGLang) and its hidden states, looked up in the cache or a feature set and computed on a
miss; a feature set's files, size and provenance record."""
