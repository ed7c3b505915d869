"""`python -m clients.web`: the web console (what `rlvr web` and `rlvr up` run)."""

import sys

from clients.web.server import main

sys.exit(main())
