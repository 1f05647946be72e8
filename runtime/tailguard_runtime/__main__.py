"""``python -m tailguard_runtime``: the same as ``tailguard-runtime``."""

import sys

from tailguard_runtime.main import main

sys.exit(main())
