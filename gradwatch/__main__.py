"""``python -m gradwatch``: the ``gradwatch`` command (as torchrun's ``-m gradwatch`` runs it)."""

import sys

from gradwatch.cli import main

sys.exit(main())
