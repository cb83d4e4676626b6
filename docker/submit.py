"""Entry point for spark-submit: `spark-submit ... docker/submit.py run [flags]`."""

import sys

from safepoint.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
