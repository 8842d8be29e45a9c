"""`python -m dflash_eval {eval,features,extract,plan,diagnose,served} …` (cli.py)."""

import sys

from dflash_eval.cli import main

sys.exit(main())
