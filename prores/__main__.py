"""`python -m prores` is the `prores` console script; launchers use it as `-m prores`."""

import sys

from prores.cli import main

sys.exit(main())
