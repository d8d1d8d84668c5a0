"""``python -m cortex``: the same command line as the ``cortex`` script."""

import sys

from cortex.cli import main

sys.exit(main())
