"""Review of firstcall3: kernel-check verdicts kept in memory and on disk (runtime/kernel_verdicts.py), the fused
build from a front lowering the front's own copy of the functional graph (passes/pipeline.py), and a compile's lazy
graph modules (compat/fx_lazy.py). Each is compared with eager: errors of the same type and message, values, the
caller's tensors after the call."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from harness import first_difference
from torch.fx.experimental.proxy_tensor import make_fx

import dealias
from dealias.passes import pipeline
from dealias.runtime import kernel_checks, kernel_verdicts
from dealias.runtime.hazards import Unfusable

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def verdicts(monkeypatch, tmp_path):
    """An empty verdict store in `tmp_path` (the process's memory of it cleared before and after)."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    kernel_verdicts.clear()
    yield tmp_path
    kernel_verdicts.clear()


def graph(f, *args) -> fx.GraphModule:
    return make_fx(f, tracing_mode="fake")(*args)


def eager_error(f, *args) -> BaseException:
    with pytest.raises(Exception) as info:
        f(*args)
    return info.value


def assert_eagers(found, expected: BaseException) -> None:
    assert found is not None, f"eager raises {expected!r}, the check found nothing"
    assert type(found[1]) is type(expected) and str(found[1]) == str(expected)


def fill(value):
    return lambda x, i: aten.index_fill.int_Scalar(x, 0, i, value)


# --- 1. verdicts kept: a kept "eager accepts" never answers for a case eager rejects -----------------------------


@pytest.mark.parametrize("accepted", [1.5, 1, True, -0.0, float("nan")])
def test_a_constants_type_is_keyed_complex_scalar_into_a_float_tensor(accepted):
    # index_fill_ with a complex scalar into a float tensor: eager's kernel raises, fake tensors accept it. A float,
    # int or bool constant accepted (and kept, on disk too) must not answer for the complex one.
    x, i = torch.zeros(8), torch.zeros(3, dtype=torch.int64)
    assert kernel_checks.first_metadata_error(graph(fill(accepted), x, i)) is None
    for _ in range(2):
        expected = eager_error(fill(1j), torch.zeros(8), torch.tensor([0, 1]))
        assert_eagers(kernel_checks.first_metadata_error(graph(fill(1j), x, i)), expected)
        expected = eager_error(fill(1 + 0j), torch.zeros(8), torch.tensor([0, 1]))
        assert_eagers(kernel_checks.first_metadata_error(graph(fill(1 + 0j), x, i)), expected)
        kernel_verdicts.clear()  # (the next process: the disk file only)


def put(buf, idx, v):
    return aten.index_put.default(buf, [None, idx], v)


def test_a_list_of_tensors_whose_entries_differ_is_keyed():
    # index_put's indices list: [None, int64] accepted must not answer for [None, int64] with float64 values, nor
    # a list whose None stands elsewhere.
    buf = torch.zeros(4, 8)
    assert (
        kernel_checks.first_metadata_error(graph(put, buf, torch.zeros(3, dtype=torch.int64), torch.zeros(4, 3)))
        is None
    )
    expected = eager_error(put, torch.zeros(4, 8), torch.tensor([0, 1, 2]), torch.ones(4, 3, dtype=torch.float64))
    found = kernel_checks.first_metadata_error(
        graph(put, buf, torch.zeros(3, dtype=torch.int64), torch.zeros(4, 3, dtype=torch.float64))
    )
    assert_eagers(found, expected)
    k = lambda f, *a: [kernel_verdicts.key_of(n) for n in graph(f, *a).graph.nodes if n.op == "call_function"][-1]  # noqa: E731
    i, v = torch.zeros(4, dtype=torch.int64), torch.zeros(4)
    assert k(lambda b, i, v: aten.index_put.default(b, [None, i], v), torch.zeros(4, 4), i, v) != k(
        lambda b, i, v: aten.index_put.default(b, [i, None], v), torch.zeros(4, 4), i, v
    )


def test_deterministic_mode_toggled_between_checks_is_keyed():
    x, i = torch.zeros(8), torch.zeros(3, dtype=torch.int64)
    keys = []
    for on, warn in ((False, False), (True, False), (True, True)):
        torch.use_deterministic_algorithms(on, warn_only=warn)
        try:
            keys.append([kernel_verdicts.key_of(n) for n in graph(fill(1.5), x, i).graph.nodes][-2])
        finally:
            torch.use_deterministic_algorithms(False)
    assert len(set(keys)) == 3


@pytest.mark.parametrize(
    "text",
    [
        '["abc", "de',  # (truncated: a writer killed mid-write of a file of its own, renamed anyway)
        '{"a": 1}',
        "[1, 2, null, [3]]",
        "null",
        "\udcff\x00garbage",
        "[" * 100000,  # (deeper than the parser's recursion)
    ],
)
def test_a_corrupt_disk_file_is_ignored_and_eagers_error_still_raised(verdicts, text):
    x, i = torch.zeros(8), torch.zeros(3, dtype=torch.int64)
    path = kernel_verdicts._path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    kernel_verdicts.clear()
    assert kernel_checks.first_metadata_error(graph(fill(1.5), x, i)) is None
    expected = eager_error(fill(1j), torch.zeros(8), torch.tensor([0, 1]))
    assert_eagers(kernel_checks.first_metadata_error(graph(fill(1j), x, i)), expected)
    kept = json.loads(path.read_text())  # (rewritten whole: this process's verdict)
    assert isinstance(kept, list) and all(isinstance(k, str) for k in kept) and len(kept) == 1


def test_a_directory_where_the_file_goes_is_no_error(verdicts):
    kernel_verdicts._path().mkdir(parents=True)
    kernel_verdicts.clear()
    x, i = torch.zeros(8), torch.zeros(3, dtype=torch.int64)
    assert kernel_checks.first_metadata_error(graph(fill(1.5), x, i)) is None
    expected = eager_error(fill(1j), torch.zeros(8), torch.tensor([0, 1]))
    assert_eagers(kernel_checks.first_metadata_error(graph(fill(1j), x, i)), expected)


WRITER = """
import sys, torch
from dealias.runtime import kernel_verdicts
who = sys.argv[1]
for r in range(60):
    kernel_verdicts.remember(f"{who}-{r}")
    kernel_verdicts.flush()
    kernel_verdicts.clear()
    assert kernel_verdicts.accepted(f"{who}-{r}") or True  # (reads whatever the other writer left)
"""


def test_two_processes_writing_the_file_at_once_leave_a_whole_file(verdicts):
    src = str(Path(pipeline.__file__).parents[2])
    env = {"PYTHONPATH": src, "DEALIAS_CACHE_DIR": str(verdicts), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, who], env=env, stderr=subprocess.PIPE) for who in "ab"]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    kept = json.loads(kernel_verdicts._path().read_text())
    # (whole, and only what the writers wrote; a verdict one writer merged while the other renamed its own file
    # over it may be lost: the next process probes that op again, slower, never wrong)
    assert isinstance(kept, list) and set(kept) <= {f"{w}-{r}" for w in "ab" for r in range(60)}
    assert {"a-59", "b-59"} & set(kept)
    assert not list(Path(verdicts).glob("*.tmp"))


# --- 2. a fused build from a front failing late --------------------------------------------------------------------


def step(x, y):
    x.add_(1)
    return x * 2 + y


def test_a_fused_build_failing_after_its_lowering_mutated_the_graph_runs_eagers_program(monkeypatch):
    # The default executor with FUSE_FIRST: the first call compiles the torch program, then the fused one from its
    # front. The fused executor here rewrites the lowered graph (a constant changed), then refuses: the torch tier
    # and later calls must compute eager's results, never the rewritten graph's.
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    seen = []

    def rewrite_then_refuse(gm, example):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is aten.mul.Tensor:
                n.args = (n.args[0], 100.0)
        gm.recompile()
        seen.append(gm)
        raise Unfusable("late refusal (review15)")

    monkeypatch.setattr(pipeline, "fused_executor", rewrite_then_refuse)
    jf = dealias.jit(step)
    for _ in range(4):
        args = [torch.randn(4), torch.randn(4)]
        expected_args = [a.clone() for a in args]
        expected = step(*expected_args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = jf(*args)
        assert first_difference(expected, got, expected_args, args) is None
    assert dealias.cache_info(jf).tiers[0].startswith("torch")
    assert len(seen) == 1 and jf.last.tier.startswith("torch")
    assert all("100.0" not in t.text for t in jf.last.traces)
    assert all(seen[0] is not g for g in (jf.last.functional.gm, jf.last.functional_gm))
    assert "100.0" not in jf.last.functional_gm.code and "100.0" not in jf.last.functional.gm.code


# --- 3. a compile's lazy graph modules -----------------------------------------------------------------------------


def test_a_programs_graphs_read_copied_pickled_and_edited_after_the_compile():
    jf = dealias.jit(step, executor="torch")
    args = [torch.randn(4), torch.randn(4)]
    expected_args = [a.clone() for a in args]
    assert first_difference(step(*expected_args), jf(*args), expected_args, args) is None
    program = jf.last
    for gm in (program.functional_gm, program.functional.gm):
        assert "def forward" in gm.code and "def forward" in str(gm)
        assert "forward" in gm.print_readable(print_output=False)
        copied = copy.deepcopy(gm)
        again = pickle.loads(pickle.dumps(gm))
        x, y = torch.randn(4), torch.randn(4)
        for other in (gm, copied, again):
            torch.testing.assert_close(other(x.clone(), y), gm(x.clone(), y), rtol=0, atol=0)
    # A graph edited after the compile, then recompiled: its code and its calls are the edited graph's.
    gm = copy.deepcopy(program.functional_gm)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.mul.Tensor:
            n.args = (n.args[0], 3)
    gm.recompile()
    assert "mul.Tensor(add, 3)" in gm.code
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(gm(x, y)[1], (x + 1) * 3 + y, rtol=0, atol=0)
    assert all(t.text for t in program.traces) and "mul.Tensor(add, 2)" in program.traces[2].text
    assert dealias.explain(jf) is not None and dealias.cache_info(jf).entries == 1
    for _ in range(2):  # (calls after the graphs were read and copied: eager's)
        args = [torch.randn(4), torch.randn(4)]
        expected_args = [a.clone() for a in args]
        assert first_difference(step(*expected_args), jf(*args), expected_args, args) is None


def test_no_call_runs_a_lazy_modules_forward(monkeypatch):
    # Every callable a program keeps must be generated code: a lazy module's `_lazy_forward` would be the module's
    # __call__ on every call (the torch executor, a program raising eager's error, a program recording autograd).
    lazy = pytest.importorskip("torch.fx._lazy_graph_module")._LazyGraphModule
    calls = []
    original = lazy._lazy_forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(lazy, "_lazy_forward", counted)

    def g(x, i):
        x.index_put_((i,), torch.ones(3, dtype=torch.float64))  # (eager raises: the dtypes)
        return x

    def h(w, x):
        return (w * x).relu().sum()

    jf, jg, jh = (dealias.jit(fn, executor="torch") for fn in (step, g, h))
    for _ in range(3):
        args = [torch.randn(4), torch.randn(4)]
        expected_args = [a.clone() for a in args]
        assert first_difference(step(*expected_args), jf(*args), expected_args, args) is None
        expected = eager_error(g, torch.zeros(8), torch.tensor([0, 1, 2]))
        with pytest.raises(type(expected)) as got:
            jg(torch.zeros(8), torch.tensor([0, 1, 2]))
        assert str(got.value) == str(expected)
        w = torch.randn(4, requires_grad=True)
        we = w.detach().clone().requires_grad_()
        x = torch.randn(4)
        jh(w, x).backward()
        h(we, x).backward()
        torch.testing.assert_close(w.grad, we.grad, rtol=0, atol=0)
    assert calls == []


# --- found in review: switches choosing eager's kernel, the torch build's configuration -------------------------


def conv(x, w, b):
    return aten.convolution.default(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)


def test_a_verdict_probed_with_onednn_off_does_not_answer_with_it_on():
    # bfloat16 input and weight, a float32 bias: oneDNN's convolution (torch.backends.mkldnn on, the default) raises,
    # the native kernel (mkldnn off) computes. An "accepts" probed with it off must not answer with it on (the key
    # had no switch: the kept verdict said accepts, and eager's error was not found).
    args = torch.zeros(1, 4, 8, 8, dtype=torch.bfloat16), torch.zeros(4, 4, 3, 3, dtype=torch.bfloat16), torch.zeros(4)
    g = graph(conv, *args)
    with torch.backends.mkldnn.flags(enabled=False):
        assert kernel_checks.first_metadata_error(g) is None
        conv(*args)  # (eager accepts it too)
    for _ in range(2):
        assert_eagers(kernel_checks.first_metadata_error(g), eager_error(conv, *args))
        kernel_verdicts.clear()  # (the next process: the disk file only)


def test_the_disk_file_is_per_torch_build_configuration():
    # Two builds of one torch commit (one version string) may have other kernels (without LAPACK, oneDNN): their
    # verdicts are kept apart.
    show = torch.__config__.show
    kernel_verdicts._build_key.cache_clear()
    here = kernel_verdicts._build_key()
    try:
        torch.__config__.show = lambda: "another build: USE_MKLDNN=OFF"
        kernel_verdicts._build_key.cache_clear()
        assert kernel_verdicts._build_key() != here
    finally:
        torch.__config__.show = show
        kernel_verdicts._build_key.cache_clear()
    assert kernel_verdicts._build_key() == here


@pytest.mark.parametrize("how", ["dynamo config", "force skip"])
def test_a_user_who_turned_lazy_graph_modules_off_gets_plain_ones(how):
    # dynamo's `use_lazy_graph_module` off (or torch's `_force_skip_lazy_graph_module`, for TorchScript, which cannot
    # script a lazy module): a program's graphs are plain graph modules, as dynamo's own are then (the compile made
    # them lazy whatever the setting).
    lazy = pytest.importorskip("torch.fx._lazy_graph_module")
    off = (
        torch._dynamo.config.patch(use_lazy_graph_module=False)
        if how == "dynamo config"
        else lazy._force_skip_lazy_graph_module()
    )
    with off:
        jf = dealias.jit(step, executor="torch")
        args = [torch.randn(4), torch.randn(4)]
        expected_args = [a.clone() for a in args]
        assert first_difference(step(*expected_args), jf(*args), expected_args, args) is None
    program = jf.last
    for gm in (program.functional_gm, program.functional.gm, program.captured.gm):
        assert not isinstance(gm, lazy._LazyGraphModule), type(gm).__mro__
    args = [torch.randn(4), torch.randn(4)]
    expected_args = [a.clone() for a in args]
    assert first_difference(step(*expected_args), jf(*args), expected_args, args) is None


def test_an_install_without_the_probes_source_keeps_verdicts_in_memory_only(monkeypatch, verdicts):
    # An install of compiled files only (or a zip): the probe's source cannot be read for the disk file's key. The
    # check must still answer as eager (it raised FileNotFoundError from the key: executor="inductor" ran the graph
    # eagerly with a FallbackWarning), and no file is written that another version would read.
    monkeypatch.setattr(kernel_verdicts, "__file__", str(verdicts / "nowhere" / "runtime" / "kernel_verdicts.py"))
    kernel_verdicts._build_key.cache_clear()
    try:
        x, i = torch.zeros(8), torch.zeros(3, dtype=torch.int64)
        for _ in range(2):
            assert kernel_checks.first_metadata_error(graph(fill(1.5), x, i)) is None
            expected = eager_error(fill(1j), torch.zeros(8), torch.tensor([0, 1]))
            assert_eagers(kernel_checks.first_metadata_error(graph(fill(1j), x, i)), expected)
        assert not list(Path(verdicts).glob("kernel_checks-*"))
    finally:
        monkeypatch.undo()
        kernel_verdicts._build_key.cache_clear()


def test_a_sparse_argument_beside_one_too_large_to_probe_is_no_error():
    # A dense argument over the probe's memory limit, then a sparse one: the probe gives up at the first (NoProbe),
    # as before the verdicts were kept; the key must not ask the sparse one for its storage (NotImplementedError
    # from the compile). Eager accepts the op.
    dense, sparse = (
        torch.empty(2048, 4096),
        torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (2048, 4096)),
    )
    g = graph(lambda a, b: aten.add.Tensor(a, b), dense, sparse)
    assert kernel_checks.first_metadata_error(g) is None
    aten.add.Tensor(dense, sparse)  # (eager's answer: accepted)


def test_the_disk_file_is_per_source_of_what_the_probe_calls(monkeypatch):
    # ir/opfacts.py says which arguments of an op are indices (a probe fills them as such): another version of it
    # is another probe, whose verdicts must not answer for this one's.
    kernel_verdicts._build_key.cache_clear()
    here = kernel_verdicts._build_key()
    read = Path.read_text

    def other_opfacts(self, *args, **kwargs):
        text = read(self, *args, **kwargs)
        return text + "\n# another version" if self.name == "opfacts.py" else text

    monkeypatch.setattr(Path, "read_text", other_opfacts)
    kernel_verdicts._build_key.cache_clear()
    try:
        assert kernel_verdicts._build_key() != here
    finally:
        monkeypatch.setattr(Path, "read_text", read)
        kernel_verdicts._build_key.cache_clear()
