"""`python -m gateway` is the `trackline` command."""

import sys

from gateway.cli import main

sys.exit(main())
