"""Test-run settings: dealias's checks between passes are on in every test (`DEALIAS_CHECK=0` turns them off,
e.g. to time the suite without them)."""

import os

os.environ.setdefault("DEALIAS_CHECK", "1")
