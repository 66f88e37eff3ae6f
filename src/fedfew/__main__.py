"""``python -m fedfew``: the ``fedfew`` command."""

import sys

from fedfew.cli import main

if __name__ == "__main__":
    sys.exit(main())
