"""`python -m dflash_eval {eval,extract} …`"""

import sys

from dflash_eval.cli import main

sys.exit(main())
