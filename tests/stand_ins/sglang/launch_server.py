"""STAND-IN for `python -m sglang.launch_server` (DFLASH mode): tests/sglang_stand_in.py."""

import sys

from tests.sglang_stand_in import serve_launched

if __name__ == "__main__":
    serve_launched(sys.argv[1:])
