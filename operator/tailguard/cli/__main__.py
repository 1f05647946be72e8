"""``python -m tailguard.cli``: the same as the ``tailguard`` command."""

import sys

from tailguard.cli.main import main

sys.exit(main())
