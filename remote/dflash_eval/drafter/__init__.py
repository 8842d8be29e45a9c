"""The drafter: its config, the DFlash and DFlash-2 models, checkpoints read in any of their
formats under the pickle policy, its settings chosen with their provenance, and its loading,
checked against the target and for finite numbers."""
