"""`python -m rlvr.clients.web`: the web console (what `rlvr web` and `rlvr up` run)."""

import sys

from rlvr.clients.web.server import main

sys.exit(main())
