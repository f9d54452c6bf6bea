"""``python -m chaos.soak --soak SECONDS ...``: the soak without ``scripts/chaos`` (same options)."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
