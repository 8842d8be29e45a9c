"""`python -m dflash_eval {eval,features,extract,plan,diagnose,served} …` (cli.py)."""

import os
import sys

from dflash_eval.cli import main

code = main()
# The interpreter's teardown is skipped: torch's finalizers take ~1 s of a cached run's wall
# for nothing. By now main has closed everything it wrote (results and cache entries renamed
# into place, the progress file closed): only the standard streams are left to flush, and a
# reader gone from them changes no exit status. An unexpected exception does not get here and
# exits as usual, with its traceback.
try:
    sys.stdout.flush()
    sys.stderr.flush()
finally:
    os._exit(code)
