import sys

from specmemo.cli import main

sys.exit(main())
