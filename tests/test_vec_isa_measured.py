"""A host measurement's inductor compile (keep_aten.py, inductor_fixes.py) is often a process's first C++ compile, so
it is where inductor probes the vector ISAs: it probes under dealias's record of them (compat/vec_isa.py), and a
later process makes its list from the record without a child process per ISA. Before, the measurement's probes went
unrecorded, and every later process's fused compile ran them again (three children on an AVX-512 host: ~0.3 s of a
warm first call on torch 2.13, more under load)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.inductor,
    pytest.mark.skipif(
        sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"),
        reason="inductor probes x86 Linux only",
    ),
]

# Inductor's own probe counted (wrapped before dealias wraps it while it records), in a process of its own.
_COUNT = """
import torch, torch._inductor.cpu_vec_isa as isa
original, probes = isa.VecISA.check_build, []
def counted(self, code):
    probes.append(str(self))
    return original(self, code)
isa.VecISA.check_build = counted
"""

_MEASURE = """
from dealias.runtime import keep_aten
from dealias.compat.vec_isa import vec_isa_config
aten, inductor = keep_aten.aten_against_inductor(lambda: (torch.rand(64),), torch.sin, torch.sin)
print("config", vec_isa_config(), "probes", len(probes))
"""

_LATER = """
from dealias.compat.vec_isa import vec_isa_config
config = vec_isa_config()
isa.valid_vec_isa_list()
print("config", config, "probes", len(probes))
"""


def _run(code: str, tmp_path: Path) -> str:
    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), env.get("PYTHONPATH", "")])
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_COUNT + code)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


def test_a_measurements_isa_probes_are_recorded_for_later_processes(tmp_path):
    first = _run(_MEASURE, tmp_path)
    if "'cpp.vec_isa_ok': True" not in first or first.endswith("probes 0"):
        pytest.skip(f"no vector ISA probed and passed on this host: {first}")
    assert _run(_LATER, tmp_path) == "config {'cpp.vec_isa_ok': True} probes 0"
