"""``python -m feedpipe``: the ``feedpipe`` command."""

import sys

from .cli.app import main

sys.exit(main())
