"""``python -m robustmq.cli``: the ``robustmq`` command."""

import sys

from robustmq.cli._main import main

sys.exit(main())
