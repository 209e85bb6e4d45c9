"""`python -m disco_xla.cli`: the `disco-xla` command (also Bazel's entry point)."""

import sys

from disco_xla.cli import main

if __name__ == "__main__":
    sys.exit(main())
