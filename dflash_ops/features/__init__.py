"""Feature sets: the target's reference completions and hidden states, computed once on a
features host (`fab extract-features`) and relayed to the eval hosts, where `run-eval
--features SET-ID` uses them instead of computing its own (see docs/features.md)."""
