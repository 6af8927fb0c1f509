"""``python -m specnb.cli ARGS``: the ``specnb`` command."""

import sys

from . import main

sys.exit(main())
