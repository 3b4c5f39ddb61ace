"""Test-run settings: dealias's checks between passes are on in every test (`DEALIAS_CHECK=0` turns them off,
e.g. to time the suite without them); the default's fused program is compiled on a program's 16th call, not its
first (`DEALIAS_FUSE_FIRST=0`). The fused executor's keep-ATen list, its choice of one-row products and of
the variance's lowering (runtime/keep_aten.py, row_products.py, inductor_fixes.py: measured per host otherwise)
are pinned, so that fused graphs are the same on every machine; test_keep_aten.py, test_row_products.py and
test_inductor_fixes.py measure."""

import os

import pytest

os.environ.setdefault("DEALIAS_CHECK", "1")
os.environ.setdefault("DEALIAS_KEEP_ATEN", "gelu,tanh,exp,_softmax")
os.environ.setdefault("DEALIAS_ROW_PRODUCTS", "inductor")
os.environ.setdefault("DEALIAS_CONV_LAYOUT", "contiguous")
os.environ.setdefault("DEALIAS_VARIANCE", "float64")
# executor="tiered" compiles the fused program in a program's first call (frontend/tiers.py): tests not about tiers
# call the default many times, compared bit for bit with eager, and would each compile with inductor. The tier tests
# set tiers.FUSE_FIRST themselves (test_promote_early.py).
os.environ.setdefault("DEALIAS_FUSE_FIRST", "0")
# ...and the first call times its tiers on copies afresh, never reading an earlier process's record of them
# (frontend/copies_record.py: a record of another run's times would choose for a tier test); test_warmcall.py reads.
os.environ.setdefault("DEALIAS_COPIES_RECORD", "0")
# ...nor runs at once the tier an earlier process settled on (frontend/tier_record.py); test_tier_record.py reads.
os.environ.setdefault("DEALIAS_TIER_RECORD", "0")
# ...and compiles every program, never loading an earlier process's capture and passes (passes/program_cache.py: a
# test replacing a pass's function would be handed the earlier result); test_program_cache.py loads.
os.environ.setdefault("DEALIAS_PROGRAM_CACHE", "0")
# ...nor an earlier process's verdict for the default partition of a joint graph (runtime/partition.py: a test that
# changes the partitioner's checks would be handed it); test_partition_record.py reads.
os.environ.setdefault("DEALIAS_PARTITION_RECORD", "0")
# ...nor an earlier process's traces of which arguments a decomposition's results read (runtime/dependence_record.py:
# tests count the traces); test_dependence_record.py reads.
os.environ.setdefault("DEALIAS_DEPENDENCE_RECORD", "0")


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """Each test starts with dynamo's caches empty: its automatic dynamic remembers a function's (or a module's)
    earlier sizes, so another test's compile of the same code would make this one's sizes symbolic.

    And no program promoted to the fused executor by the seconds its calls took (tiers.PROMOTE_AFTER_SECONDS): on
    a loaded machine a few calls of a small module passed them, and a test comparing bit for bit with eager got the
    fused program's last bits (test_api's training script, once). Tests about promotion set it themselves."""
    import torch

    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER_SECONDS", float("inf"))
    torch._dynamo.reset()
    yield


@pytest.fixture
def verdict_store(monkeypatch, tmp_path):
    """An empty store of measured verdicts (runtime/keep_aten.py's, shared by row_products.py) in `tmp_path`, as a
    process on a new host sees it; the test sets which setting measures."""
    from dealias.runtime import keep_aten

    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(keep_aten, "_memory", {})
    return tmp_path


@pytest.fixture
def calls_one_by_one(monkeypatch):
    """Candidates taking turns call by call, each call after a tier's first timed (frontend/tiers.py's TURN_CALLS
    and SWITCH_CALLS at 1 and 0): for tests that count the calls of each tier the choice rules take (tests/
    test_turns.py tests the turns)."""
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "TURN_CALLS", 1)
    monkeypatch.setattr(tiers, "SWITCH_CALLS", 0)


# Markers for the inner loop (`make test-fast` deselects them; CI runs everything): whole files that compile with
# inductor or start processes, and single tests marked `slow` where they stand.
_INDUCTOR_FILES = {"test_inductor.py", "test_fused_autograd.py", "test_inductor_fixes.py", "test_keep_aten.py"}
_INDUCTOR_FILES |= {"test_row_products.py", "test_inductor_symbolic.py", "test_partition_record.py"}
_INDUCTOR_FILES |= {"test_inductor_snapshots.py", "test_inductor_indices.py", "test_inductor_tiers.py"}
_INDUCTOR_FILES |= {"test_fused_autograd_training.py"}
_DISTRIBUTED_FILES = {"test_distributed.py"}
# Whole files of long runs (fuzz, the OpInfo sweeps, HF models and optimizers, a thousand statements): 7 of the
# inner loop's 9 minutes were spent there and in a few single tests marked where they stand.
_SLOW_FILES = {"test_fuzz.py", "test_opinfo.py", "test_real_programs.py", "test_long_programs.py"}
_SLOW_FILES |= {"test_fused_errors.py"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes tens of seconds or more (deselected by make test-fast)")
    config.addinivalue_line("markers", "inductor: compiles with inductor (seconds each)")
    config.addinivalue_line("markers", "distributed: starts gloo processes")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name in _INDUCTOR_FILES:
            item.add_marker(pytest.mark.inductor)
        if name in _DISTRIBUTED_FILES:
            item.add_marker(pytest.mark.distributed)
        if name in _SLOW_FILES:
            item.add_marker(pytest.mark.slow)
