"""``python -m tests.migrations.offline``: see the package's docstring."""

import sys

from tests.migrations.offline import main

sys.exit(main())
