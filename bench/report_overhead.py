"""What recording the report costs (DEALIAS_REPORT=DIR, docs/architecture.md "The compile report"): a 200-step
training loop of a small model (a graph break, a recompile half way), timed in a fresh process without and with
recording, five times each; prints the medians (all steps, the compiling steps, a cached step).
`python bench/report_overhead.py`."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

LOOP = r"""
import time, warnings, torch, dealias
warnings.simplefilter("ignore")
torch.manual_seed(0)
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
    def forward(self, x):
        h = self.lin(x).relu_()
        torch._dynamo.graph_break()
        return h.pow(2).mean()
model = Model()
jm = dealias.jit(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = []
for i in range(200):
    x = torch.randn(16 if i < 100 else 24, 64)
    start = time.perf_counter()
    opt.zero_grad()
    jm(x).backward()
    opt.step()
    times.append(time.perf_counter() - start)
compiling = times[0] + times[100] + times[101]  # (the first call, the new batch size, then made symbolic)
steady = sorted(t for i, t in enumerate(times) if i not in (0, 100, 101))
print(sum(times), compiling, steady[len(steady) // 2])
"""


def run(record: bool) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "DEALIAS_REPORT"}
    with tempfile.TemporaryDirectory() as d:
        if record:
            env["DEALIAS_REPORT"] = d
        out = subprocess.run([sys.executable, "-c", LOOP], env=env, capture_output=True, text=True, check=True)
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    for record in (False, True):
        runs = [run(record) for _ in range(5)]
        total, compiling, step = (statistics.median(r[k] for r in runs) for k in range(3))
        print(
            f"DEALIAS_REPORT {'set  ' if record else 'unset'}: 200 steps {total * 1e3:.0f} ms, of which the 3 "
            f"compiling steps {compiling * 1e3:.0f} ms; a cached step {step * 1e6:.0f} us (medians of 5 runs)"
        )


if __name__ == "__main__":
    main()
