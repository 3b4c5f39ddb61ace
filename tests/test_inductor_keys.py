"""Triton's key remembered on disk (compat/inductor_keys.py; issue 38: first calls): torch's `triton_key` is
computed by torch once, recorded under a fingerprint of the files it hashes, and a later process with the same
files gets torch's cache filled from the record before its first compile. Any change of those files, a damaged
record or a value already computed leaves torch computing it as always."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch._inductor.codecache as codecache
from torch.utils._functools import prefetchable_cache

from dealias.compat import inductor_keys

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def fake_triton(monkeypatch, tmp_path):
    """A triton tree of its own in `tmp_path`, torch's `triton_key` a fresh prefetchable cache over a function that
    hashes nothing and counts its calls, records in `tmp_path / "cache"`; the module acting as in a new process."""
    root = tmp_path / "triton"
    for sub in ("compiler", "backends/cpu", "language", "runtime", "_C"):
        (root / sub).mkdir(parents=True)
    for name in ("__init__.py", "compiler/code.py", "backends/cpu/driver.py", "language/core.py", "runtime/cache.py"):
        (root / name).write_text("# " + name)
    (root / "_C" / "libtriton.so").write_bytes(b"\0" * 64)
    calls = []

    def process() -> None:  # (what a new process starts with: torch's cache empty, nothing claimed or read)
        def compute() -> str:
            calls.append(1)
            return f"key-{len(calls)}"

        monkeypatch.setattr(codecache, "triton_key", prefetchable_cache(compute))
        inductor_keys.reset_for_tests()

    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(inductor_keys, "ENABLED", True)
    monkeypatch.setattr(inductor_keys, "triton_root", lambda: root)
    monkeypatch.setattr(inductor_keys, "_SOURCES", {"triton_key": inductor_keys._SOURCES["triton_key"]})
    monkeypatch.setattr(codecache, "triton_key", codecache.triton_key)  # (set back after the test)
    process()
    yield root, calls, process
    inductor_keys.reset_for_tests()


def prefill() -> str:
    """`inductor_keys.prefill`'s outcome for triton's key (or for every key, where it did nothing)."""
    out = inductor_keys.prefill()
    return out.get("triton_key", out.get("all"))


def test_a_later_process_gets_the_recorded_value_without_computing_it(fake_triton):
    root, calls, process = fake_triton
    assert prefill() == "recorded"
    assert calls == [1] and codecache.triton_key() == "key-1"
    assert prefill() == "done before"  # (once per process)
    process()
    assert prefill() == "from record"
    assert codecache.triton_key() == "key-1" and calls == [1]  # torch's cache holds the recorded value


@pytest.mark.parametrize("change", ["rewrite", "touch", "add", "remove", "library", "version", "cache.py"])
def test_a_change_of_what_triton_key_reads_computes_it_again(fake_triton, change):
    root, calls, process = fake_triton
    assert prefill() == "recorded"
    time.sleep(0.01)  # (a later modification time on every file system)
    if change == "rewrite":
        (root / "compiler" / "code.py").write_text("# code.py")  # (the same bytes written again)
    elif change == "touch":
        os.utime(root / "language" / "core.py")
    elif change == "add":
        (root / "backends" / "cpu" / "new.py").write_text("")
    elif change == "remove":
        (root / "backends" / "cpu" / "driver.py").unlink()
    elif change == "library":
        (root / "_C" / "libtriton.so").write_bytes(b"\1" * 64)  # (the same size)
    elif change == "version":
        (root / "__init__.py").write_text("# __init__.pz")
    else:
        (root / "runtime" / "cache.py").write_text("# runtime/cache.pz")
    process()
    assert prefill() == "recorded"
    assert codecache.triton_key() == "key-2" and len(calls) == 2


def test_compiled_python_beside_the_sources_changes_nothing(fake_triton):
    root, calls, process = fake_triton
    inductor_keys.prefill()
    (root / "compiler" / "__pycache__").mkdir()
    (root / "compiler" / "__pycache__" / "code.cpython-311.pyc").write_bytes(b"pyc")
    process()
    assert prefill() == "from record" and calls == [1]


def test_a_copied_tree_is_another_install(fake_triton, tmp_path):
    """The fingerprint names the files' paths and inodes: the same files copied elsewhere are computed again."""
    import shutil

    root, calls, process = fake_triton
    inductor_keys.prefill()
    copy = Path(shutil.copytree(root, tmp_path / "elsewhere" / "triton", copy_function=shutil.copy2))
    process()
    inductor_keys.triton_root = lambda: copy  # (monkeypatched by the fixture: set back after the test)
    assert prefill() == "recorded" and len(calls) == 2


@pytest.mark.parametrize("damage", ["not json", "[1, 2]", '{"%s": 7}'])
def test_a_damaged_record_is_computed_again(fake_triton, damage):
    root, calls, process = fake_triton
    inductor_keys.prefill()
    path = Path(os.environ["DEALIAS_CACHE_DIR"]) / "inductor_keys.json"
    if "%s" in damage:  # (a value of another kind under the right key)
        damage = damage % next(iter(__import__("json").loads(path.read_text())))
    path.write_text(damage)
    process()
    assert prefill() == "recorded"
    assert codecache.triton_key() == "key-2"


def test_a_value_computed_before_is_left_alone(fake_triton):
    root, calls, process = fake_triton
    inductor_keys.prefill()
    process()
    assert codecache.triton_key() == "key-2"  # (another compile of the process computed it first)
    assert prefill() == "computed before"
    assert codecache.triton_key() == "key-2"


def test_nothing_without_triton_or_when_off(fake_triton, monkeypatch):
    root, calls, process = fake_triton
    monkeypatch.setattr(inductor_keys, "triton_root", lambda: None)
    assert prefill() == "nothing to read"
    process()
    monkeypatch.setattr(inductor_keys, "ENABLED", False)
    assert prefill() == "off"
    assert calls == [] and not (Path(os.environ["DEALIAS_CACHE_DIR"]) / "inductor_keys.json").exists()


def test_a_failure_leaves_torch_computing_it(fake_triton, monkeypatch):
    root, calls, process = fake_triton

    def broken(*args):
        raise OSError("unreadable")

    monkeypatch.setattr(inductor_keys, "fingerprint", broken)
    assert prefill() == "failed"
    assert calls == [] and codecache.triton_key() == "key-1"


@pytest.fixture
def fake_torch(tmp_path):
    """A package tree of torch's shape (packages, a directory of headers that is no package, an extension module)
    and a stand-in of inductor's codecache module whose `torch_key` counts its computations."""
    root = tmp_path / "torch"
    for name in (
        "__init__.py",
        "_C.cpython-311-x86_64-linux-gnu.so",
        "nn/__init__.py",
        "nn/modules/__init__.py",
        "nn/modules/linear.py",
        "_inductor/__init__.py",
        "_inductor/codecache.py",
        "_inductor/script.ld",
        "include/ATen/core.h",
        "utils/data.py",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("# " + name)
    calls = []

    def process() -> types.SimpleNamespace:
        def compute() -> bytes:
            calls.append(1)
            return bytes([len(calls)]) * 32

        return types.SimpleNamespace(
            _TORCH_PATH=str(root),
            __file__=str(root / "_inductor" / "codecache.py"),
            torch_key=prefetchable_cache(compute),
        )

    return root, calls, process


def _fill_torch_key(codecache) -> str:
    return inductor_keys._fill(codecache, "torch_key", inductor_keys._torch_sources)


@pytest.mark.parametrize(
    "change, computed",
    [
        ("nothing", False),
        ("header", False),  # (not a module of a package: torch_key does not read it)
        ("pyc", False),
        ("not a package", False),  # (utils has no __init__: pkgutil does not descend into it)
        ("module", True),
        ("extension", True),
        ("new module", True),
        ("new package", True),
        ("script.ld", True),
    ],
)
def test_torchs_key_is_recorded_under_its_packages_modules(fake_triton, fake_torch, change, computed):
    root, calls, process = fake_torch
    first = process()
    assert _fill_torch_key(first) == "recorded" and first.torch_key() == bytes([1]) * 32
    time.sleep(0.01)
    if change == "header":
        (root / "include" / "ATen" / "core.h").write_text("changed")
    elif change == "pyc":
        (root / "nn" / "__pycache__").mkdir()
        (root / "nn" / "__pycache__" / "linear.cpython-311.pyc").write_bytes(b"pyc")
    elif change == "not a package":
        (root / "utils" / "data.py").write_text("changed")
    elif change == "module":
        (root / "nn" / "modules" / "linear.py").write_text("# nn/modules/linear.pz")
    elif change == "extension":
        os.utime(root / "_C.cpython-311-x86_64-linux-gnu.so")
    elif change == "new module":
        (root / "nn" / "modules" / "conv.py").write_text("")
    elif change == "new package":
        (root / "nn" / "parallel").mkdir()
        (root / "nn" / "parallel" / "__init__.py").write_text("")
    elif change == "script.ld":
        (root / "_inductor" / "script.ld").write_text("changed")
    second = process()
    assert _fill_torch_key(second) == ("recorded" if computed else "from record")
    assert second.torch_key() == bytes([2 if computed else 1]) * 32  # (bytes, as torch's own)
    assert len(calls) == (2 if computed else 1)


_PROCESS = textwrap.dedent(
    """
    import json, sys, torch
    import dealias
    import torch._inductor.codecache as codecache
    from torch._inductor.runtime import triton_compat
    if sys.argv[1] == "second":  # torch's own computation made to fail: the value must come from the record
        def refuse():
            raise AssertionError("triton's key computed again")
        triton_compat.triton_key = refuse
    f = dealias.jit(lambda x: (x * 2).sin_(), executor="inductor")
    x = torch.randn(8)
    torch.testing.assert_close(f(x.clone()), (x * 2).sin_())
    print(json.dumps([codecache.triton_key(), codecache.torch_key().hex()]))
    """
)


def test_a_second_process_compiles_with_torchs_own_values_from_the_record(tmp_path):
    """With the real torch (and triton, where installed): the first process's fused compile records the keys torch
    computed; the second's compile gets them from the record (its own computation of triton's would raise), and
    they are what torch computes now."""
    import json

    from torch._inductor.runtime import triton_compat

    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "cache"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.pop("DEALIAS_INDUCTOR_KEYS", None)
    values = []
    for which in ("first", "second"):
        p = subprocess.run([sys.executable, "-c", _PROCESS, which], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-3000:]
        values.append(json.loads(p.stdout.strip().splitlines()[-1]))
    record = json.loads((tmp_path / "cache" / "inductor_keys.json").read_text())
    assert len(record) == (2 if inductor_keys.triton_root() is not None else 1)
    codecache.torch_key.clear()  # (computed by torch now, not from any record)
    triton = triton_compat.triton_key() if inductor_keys.triton_root() is not None else None
    assert values[0] == values[1] == [triton, codecache.torch_key().hex()]
