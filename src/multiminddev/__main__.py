"""``python -m multiminddev``: the ``multiminddev`` command, where no script is on PATH."""

import sys

from multiminddev.cli import main

sys.exit(main())
