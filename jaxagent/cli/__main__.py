"""``python -m jaxagent.cli``: the ``jaxagent`` command."""

import sys

from jaxagent.cli.main import main

sys.exit(main())
