"""STAND-IN for the `sglang` package: only `python -m sglang.launch_server` in DFLASH mode,
served by tests/sglang_stand_in.py (SGLang needs a GPU build; it cannot run here). Put this
directory, the repository and remote/ on PYTHONPATH to use it."""
