"""`diagnose`: one drafter held against another on the same prompts and features, what it
measures beyond τ, and the findings ranked (their summary for people is
contract/diagnose_summary.py: the workstation shows it)."""
