"""What the harness and the workstation share, stdlib only: the run options and the command
line's grammar, the prompts and their hash, the results' types and how to read and summarise
them, the progress events, errors, numbers, URLs and dtype names, the drafter config keys and
the weights' keys, and the harness's identity (content hash, numerics version).

The foot of the harness's ladder (it imports nothing else of the harness) and the only part
of it the workstation imports, so that the workstation never loads torch
(tests/unit/test_layering.py holds both rules).
"""
