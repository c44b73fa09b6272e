"""``python -m attnscope …``: the same as the ``attnscope`` command."""

from __future__ import annotations

import sys

from attnscope.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
