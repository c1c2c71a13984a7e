"""`python -m specmemo.cli`: the `specmemo` command."""

import sys

from specmemo.cli import main

sys.exit(main())
