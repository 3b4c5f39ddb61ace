"""What a cached call checks, per program (issue 38: dealias's own cost per call). A program that changes no caller
tensor gets a lean lookup without the check that its inputs' storages are distinct (frontend/guards.lean_check,
ir/plan.writes_caller): calls whose inputs share memory then run the program compiled for distinct storages, and
must match eager (values, gradients, aliasing of outputs). A program that writes an input keeps the check: such a
call leaves the lean lookup and compiles its own layout."""

from __future__ import annotations

import pytest
import torch
from harness import like_eager_within_ulps

import dealias

EXECUTORS = ["torch", "exact", pytest.param("inductor", marks=pytest.mark.inductor)]


def _lean(jf):
    return jf.stats.graphs[0].lean


def _warmed(fn, executor):
    """`fn` compiled and called 3 times on two distinct inputs (as eager), its lean lookup built."""
    jf = dealias.jit(fn, executor=executor)
    x, y = torch.randn(6), torch.randn(6)
    for _ in range(3):
        like_eager_within_ulps(fn, jf, x, y)
    return jf


def _lean_hit(jf) -> bool:
    lean = _lean(jf)
    return lean is not None and lean[1] is jf.last


def _checks_storages(jf) -> bool:
    # (the generated check reads each tensor's storage: its Python object, `storage`, or its id, `sid`)
    return bool({"sid", "storage"} & set(_lean(jf)[0].__code__.co_names))


def reads(a, b):
    return a * 2 + b.sum(), a[1:]  # (an output that is a view of an input)


def writes(a, b):
    a.add_(1)
    return a * b


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_program_reading_only_runs_shared_inputs_without_compiling_again(executor):
    jf = _warmed(reads, executor)
    assert _lean_hit(jf) and not _checks_storages(jf)
    compiles = jf.stats.compiles
    base = torch.randn(12)
    # (disjoint, overlapping, the same memory as two tensors; another stride would be another dynamo graph)
    for a, b in [(base[:6], base[6:]), (base[:6], base[3:9]), (base[:6], base[:6])]:
        like_eager_within_ulps(reads, jf, a, b)
        assert _lean_hit(jf)
    assert jf.stats.compiles == compiles


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_program_writing_an_input_keeps_the_storage_check(executor):
    jf = _warmed(writes, executor)
    assert _lean_hit(jf) and _checks_storages(jf)
    base = torch.randn(12)
    for a, b in [(base[:6], base[3:9]), (base[:6], base[:6])]:
        like_eager_within_ulps(writes, jf, a, b)  # b reads what a's write changed: eager's values only with the check
        assert not _lean_hit(jf)


def loss(w, a, b):
    return ((a * w).sum() * (b * w).sum()).tanh()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_gradients_through_inputs_sharing_a_base(executor):
    """Two overlapping views of one leaf, passed where distinct tensors were compiled: each gradient goes through its
    own view's history into the leaf, as eager's."""
    jf = dealias.jit(loss, executor=executor)

    def run(f, w, a, b):
        out = f(w, a, b)
        out.backward()
        return out

    for _ in range(3):  # compiled for views of two leaves
        w, l1, l2 = (torch.randn(n, requires_grad=True) for n in (4, 6, 6))
        run(jf, w, l1[:4], l2[2:])
    assert _lean_hit(jf) and not _checks_storages(jf)
    leaf = torch.randn(6, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    got = run(jf, w, leaf[:4], leaf[2:])
    assert _lean_hit(jf)
    leaf_e, w_e = leaf.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    expected = run(loss, w_e, leaf_e[:4], leaf_e[2:])
    close = torch.equal if executor != "inductor" else lambda x, y: torch.allclose(x, y, rtol=1e-5, atol=1e-6)
    assert close(got, expected)
    assert close(leaf.grad, leaf_e.grad) and close(w.grad, w_e.grad)


def test_the_plan_says_which_programs_write():
    jr, jw = dealias.jit(reads, executor="torch"), dealias.jit(writes, executor="torch")
    jr(torch.randn(6), torch.randn(6))
    jw(torch.randn(6), torch.randn(6))
    assert jr.last.writes is False and jw.last.writes is True


class Observed(torch.nn.Module):
    """A buffer written under no_grad inside a forward autograd records (a QAT observer): functionalize writes it back
    inside the graph (gradops.write_back_now), not in the plan's write-backs; the program writes all the same."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("seen", torch.ones(()))

    def forward(self, x):
        with torch.no_grad():
            self.seen.mul_(0.9).add_(x.detach().abs().max(), alpha=0.1)
        return self.lin(x / self.seen).sum()


def test_a_write_back_inside_the_graph_is_a_write():
    m = Observed()
    jf = dealias.jit(m.forward, executor="torch")
    jf(torch.randn(2, 4))
    assert jf.last.writes is True and _checks_storages(jf)


def relu_inplace(x, w):
    h = x @ w
    h.relu_()  # (memory the program made: not the caller's)
    return h.sum()


def test_an_in_place_op_on_memory_the_program_made_is_no_write():
    jf = dealias.jit(relu_inplace, executor="torch")
    jf(torch.randn(3, 4), torch.randn(4, 4))
    assert jf.last.writes is False
