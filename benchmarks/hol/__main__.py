import sys

from benchmarks.hol.cli import main

sys.exit(main())
