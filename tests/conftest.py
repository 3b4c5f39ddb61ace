"""Test-run settings: dealias's checks between passes are on in every test (`DEALIAS_CHECK=0` turns them off,
e.g. to time the suite without them). The fused executor's keep-ATen list is pinned (runtime/keep_aten.py:
measured per host otherwise), so that fused graphs are the same on every machine; test_keep_aten.py measures."""

import os

os.environ.setdefault("DEALIAS_CHECK", "1")
os.environ.setdefault("DEALIAS_KEEP_ATEN", "gelu,tanh,exp,_softmax")
