"""``python3 -m gpufleet_check``: the command line (cli.main) from a checkout, with PYTHONPATH=roles/payload/files.

gpufleet_check.pyz has its own __main__.py at the top of the archive (written
by tools/build_pyz.py) that does the same.
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
