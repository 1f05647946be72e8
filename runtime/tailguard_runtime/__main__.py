"""``python -m tailguard_runtime``: the same as ``tailguard-runtime``."""

import sys

from .server import main

sys.exit(main())
