"""``python -m precswitch``: the same CLI as the ``precswitch`` command."""

import sys

from .cli import main

sys.exit(main())
