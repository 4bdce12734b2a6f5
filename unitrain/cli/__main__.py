"""``python -m unitrain.cli``: the ``unitrain`` command."""

import sys

from unitrain.cli._main import main

if __name__ == "__main__":
    sys.exit(main())
