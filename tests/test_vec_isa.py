"""compat/vec_isa.py: inductor's probe of the host's vector ISAs runs once per host for dealias's compiles, its
verdict kept on disk; the compile then tells inductor `cpp.vec_isa_ok=True` only where every ISA the CPU's flags
name passed the probe, and never over the user's own setting."""

from __future__ import annotations

import platform
import sys

import pytest
import torch

from dealias.compat import vec_isa

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"), reason="inductor probes x86 Linux only"
)


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """A fresh process's view (no verdict known in memory), an empty verdict directory, and inductor's probe
    replaced: `found[0]` is what it finds (the flagged ISAs, or fewer); `calls` has the `cpp.vec_isa_ok` setting of
    each of its runs (None: the base probe runs; True: a list made from the verdict, compat/vec_isa.py)."""
    import torch._inductor.cpu_vec_isa as isa

    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    vec_isa._all_pass.cache_clear()
    flags = set(isa.x86_isa_checker())
    named = [v for v in isa.supported_vec_isa_list if all(f in flags for f in str(v).split())]
    if not named:
        pytest.skip("this CPU names no vector ISA inductor knows")
    found, calls = [named], []

    def valid_vec_isa_list():
        calls.append(torch._inductor.config.cpp.vec_isa_ok)
        return found[0]

    monkeypatch.setattr(isa, "valid_vec_isa_list", valid_vec_isa_list)
    yield found, calls, named
    vec_isa._all_pass.cache_clear()


def test_the_probe_runs_once_per_host_and_its_verdict_is_kept(probe):
    found, calls, _ = probe
    assert vec_isa.vec_isa_config() == {"cpp.vec_isa_ok": True}
    assert calls == [None]
    vec_isa._all_pass.cache_clear()  # (another process on the same host)
    assert vec_isa.vec_isa_config() == {"cpp.vec_isa_ok": True}
    assert calls == [None, True]  # read from disk, not probed again: the list made under the verdict


def test_an_isa_that_fails_the_probe_leaves_inductor_probing(probe):
    found, calls, named = probe
    found[0] = named[1:]  # (the widest ISA does not build or load here)
    assert vec_isa.vec_isa_config() == {}
    vec_isa._all_pass.cache_clear()
    assert vec_isa.vec_isa_config() == {}
    assert calls == [None]  # (the negative verdict is kept too: inductor's own probe decides in each process)


@pytest.mark.parametrize("setting", [True, False])
def test_the_users_setting_stands(probe, setting):
    _, calls, _ = probe
    with torch._inductor.config.patch({"cpp.vec_isa_ok": setting}):  # (TORCHINDUCTOR_VEC_ISA_OK)
        assert vec_isa.vec_isa_config() == {}
    assert calls == []


@pytest.mark.inductor
def test_a_fused_compile_records_the_verdict(probe, tmp_path):
    """The fused executor's compile goes through the verdict (the probe is faked: its answer is the CPU's flags)."""
    import dealias

    _, calls, _ = probe
    jf = dealias.jit(lambda x: x.mul_(2).sin(), executor="inductor")
    x = torch.randn(8)
    expected = x.clone().mul_(2).sin()
    assert calls == []
    torch.testing.assert_close(jf(x), expected)
    assert calls  # (inductor asks again for its list: the real one is cached for the process)
    assert [p.read_text() for p in tmp_path.glob("vec_isa-*")] == ["1"]
