"""The run tests/test_report.py reports on (started with DEALIAS_REPORT=DIR): `dealias demo`'s programs, a
200-step training loop with a graph break and a recompile (its batch grows half way), and a call whose inputs
share memory. Every result is compared with eager; the script prints OK at the end, or fails."""

from __future__ import annotations

import sys
import warnings

import torch

import dealias
from dealias.tools import demo


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        h = self.lin(x).relu_()
        torch._dynamo.graph_break()  # the user's graph break: the rest is a second graph
        return h.pow(2).mean()


def train(steps: int) -> bool:
    torch.manual_seed(0)
    eager_model = Model()
    model = Model()
    model.load_state_dict(eager_model.state_dict())
    jm = dealias.jit(model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ok = True
    for i in range(steps):
        x = torch.randn(4 if i < steps // 2 else 6, 8)  # a larger batch half way: a recompile
        for m, o, f in ((eager_model, eager_opt, eager_model), (model, opt, jm)):
            o.zero_grad()
            loss = f(x)
            loss.backward()
            o.step()
            if m is eager_model:
                expected = loss.detach()
        ok &= bool(torch.allclose(loss.detach(), expected))
    for a, b in zip(eager_model.state_dict().values(), model.state_dict().values()):
        ok &= bool(torch.allclose(a, b))
    return ok


def shared_memory() -> bool:
    def scale_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(2)  # b sees this write: b overlaps a
        return b + 1

    buf, eager_buf = torch.arange(10.0), torch.arange(10.0)
    got = dealias.jit(scale_first)(buf[:6], buf[2:8])
    expected = scale_first(eager_buf[:6], eager_buf[2:8])
    return bool(torch.equal(got, expected) and torch.equal(buf, eager_buf))


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok = demo.run() == 0
        ok &= train(steps)
        ok &= shared_memory()
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
