"""python -m imgcopy: the imgcopy command, as the console script runs it."""
import sys

from ._program import main

sys.exit(main())
