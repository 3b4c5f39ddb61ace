"""The compile report (`DEALIAS_REPORT=DIR`, `dealias.report`, `dealias report DIR`): the page of a run of the demo
programs, a 200-step training loop with a graph break and a recompile, and inputs sharing memory
(tests/report_run.py, which checks every result against eager), read as HTML and, where Debian's chromium and
chromium-driver are installed (the Makefile's `browser` step), in headless Chromium."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import dealias
from dealias.report import records
from dealias.tools.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _env(directory: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, DEALIAS_REPORT=str(directory), PYTHONPATH=path)


@pytest.fixture(scope="module")
def run_report(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("report")
    script = ROOT / "tests" / "report_run.py"
    done = subprocess.run(
        [sys.executable, str(script), "200"], env=_env(directory), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"demo: report written to {directory / 'index.html'}" in done.stdout
    return directory


class _Page(HTMLParser):
    """What the tests read of a page: ids, links, functions, list items and the write-back maps' rects."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.functions: list[str] = []
        self.items: dict[str, list[tuple[str, str]]] = {}  # li class -> (function, text)
        self.rects: list[tuple[str, dict[str, str | None]]] = []  # (function, attributes incl. the lane's label)
        self._stack: list[str] = []
        self._lane: dict[str, str | None] = {}
        self._text: list[str] | None = None
        self._li = ""
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and "loc" in (a.get("class") or "").split():
            self.links.append(a["data-target"])
        if tag == "h2":
            self._in_h2 = True
            self.functions.append("")
        if tag == "li" and a.get("class"):
            self._li, self._text = a["class"], []
        if tag == "g" and a.get("class") == "lane":
            self._lane = a
        if tag == "rect" and a.get("class") == "region":
            self.rects.append((self.functions[-1], {**a, "lane": self._lane.get("data-label")}))

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False
        if tag == "li" and self._text is not None:
            self.items.setdefault(self._li, []).append((self.functions[-1], "".join(self._text)))
            self._text = None

    def handle_data(self, data):
        if self._in_h2:
            self.functions[-1] += data
        if self._text is not None:
            self._text.append(data)


def _page(path: Path) -> tuple[str, _Page]:
    text = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    return text, page


def _byte_runs(mark: torch.Tensor, itemsize: int) -> list[tuple[int, int]]:
    """[start, end) byte runs of the True elements of a flat mask."""
    runs, start = [], None
    for i, m in enumerate([*mark.tolist(), False]):
        if m and start is None:
            start = i
        if not m and start is not None:
            runs.append((start * itemsize, i * itemsize))
            start = None
    return runs


def _kv_slot_bytes() -> list[tuple[int, int]]:
    """The bytes of `dealias demo`'s KV cache (1, 2, 8, 4) float32 its step writes, slot 3, as eager writes them."""
    cache = torch.zeros(1, 2, 8, 4)
    cache[:, :, 3] = 1  # the demo's `k_cache[:, :, pos] = k` at pos 3
    return _byte_runs(cache.reshape(-1) != 0, 4)


def _rects(page: _Page, function: str, lane_prefix: str) -> list[tuple[int, int]]:
    return [
        (int(a["data-start"]), int(a["data-end"]))
        for f, a in page.rects
        if f == function and (a["lane"] or "").startswith(lane_prefix)
    ]


def test_page_of_a_run(run_report):
    text, page = _page(run_report / "index.html")
    # self-contained: nothing loaded from elsewhere (no src= or href= but the page's own anchors)
    assert "<script>" in text and not re.findall(r"""(?<![-\w])(?:src|href)=["'](?!#)""", text)
    # every function of the run, its name escaped (a nested function's `<locals>`)
    for name in ("seed_program", "kv_cache_write", "decode_step", "Model", "shared_memory.<locals>.scale_first"):
        assert name in page.functions
    assert "<locals>" not in text and "&lt;locals&gt;" in text
    # every node's source link has its target on the page
    assert len(page.links) > 50 and set(page.links) <= page.ids
    # the KV-cache step writes exactly slot 3 of each cache, in place
    expected = _kv_slot_bytes()
    assert _rects(page, "kv_cache_write", "k_cache.select") == expected
    assert _rects(page, "kv_cache_write", "v_cache.select") == expected
    assert all(a["data-kind"] == "in place" for f, a in page.rects if (a["lane"] or "").startswith("k_cache.select"))
    # the decode step's symbolic position, evaluated at the compiling call (pos=1): slot 1 of each head
    cache = torch.zeros(1, 2, 16, 4)
    cache[:, :, 1] = 1
    assert _rects(page, "decode_step", "k_cache.slice(2, pos") == _byte_runs(cache.reshape(-1) != 0, 4)
    # inputs sharing memory: a = buf[:6] and b = buf[2:8] of 10 floats overlap in buf[2:6]
    assert _rects(page, "shared_memory.<locals>.scale_first", "overlap") == [(8, 24)]
    assert _rects(page, "shared_memory.<locals>.scale_first", "a") == [(0, 24)]
    assert _rects(page, "shared_memory.<locals>.scale_first", "b") == [(8, 32)]
    # the training loop: its graph break with the user's line, its recompile with cache_info's reason
    breaks = [t for f, t in page.items["break"] if f == "Model"]
    assert len(breaks) == 1 and "report_run.py:25" in breaks[0]
    misses = [t for f, t in page.items["miss"] if f == "Model"]
    assert misses[0] == "first call" and "size mismatch" in misses[1]
    assert "expected 4, actual 6" in text  # (cache_info's words, as its last_miss_reason says it)


def test_crashed_run_rebuilt_from_records(tmp_path):
    program = (
        "import os, torch, dealias\n"
        "def bump(x):\n"
        "    x[1].add_(1)\n"
        "    return x.sum()\n"
        "x, y = torch.zeros(3, 4), torch.zeros(3, 4)\n"
        "assert dealias.jit(bump)(x) == bump(y) and torch.equal(x, y)\n"
        "os._exit(3)  # a crash: no exit handlers, no page written at exit\n"
    )
    done = subprocess.run([sys.executable, "-c", program], env=_env(tmp_path), capture_output=True, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    (tmp_path / "index.html").unlink(missing_ok=True)
    with open(next(tmp_path.glob("records-*.jsonl")), "a") as f:
        f.write('{"event": "compile", "functi')  # a record cut short by the crash
    assert cli(["report", str(tmp_path)]) == 0
    _, page = _page(tmp_path / "index.html")
    assert page.functions == ["bump"]
    assert _rects(page, "bump", "x.select") == [(16, 32)]  # row 1 of a (3, 4) float32 tensor


def test_report_from_code(tmp_path):
    assert records.ACTIVE is None  # DEALIAS_REPORT unset: nothing records, each hook is one check of this
    try:
        first = dealias.report(tmp_path)
        assert first == tmp_path / "index.html" and records.ACTIVE is not None

        def write_row(cache, row, pos: int):
            cache[pos].copy_(row)
            return cache.sum()

        cache, eager_cache, row = torch.zeros(5, 3), torch.zeros(5, 3), torch.randn(3)
        got = dealias.jit(write_row)(cache, row, 2)
        assert torch.equal(got, write_row(eager_cache, row, 2)) and torch.equal(cache, eager_cache)

        def put_rows(cache, index, rows):
            cache.index_put_((index,), rows)
            return cache.sum()

        index, rows = torch.tensor([1, 3]), torch.ones(2, 3)
        got = dealias.jit(put_rows)(cache, index, rows)
        assert torch.equal(got, put_rows(eager_cache, index, rows)) and torch.equal(cache, eager_cache)
        path = dealias.report(tmp_path)
        _, page = _page(path)
    finally:
        records.stop()
    assert records.ACTIVE is None
    name = "test_report_from_code.<locals>.write_row"
    assert page.functions == [name, "test_report_from_code.<locals>.put_rows"]
    assert _rects(page, name, "cache.select") == [(24, 36)]
    # an indexed write: drawn as the region indexed (the whole cache here), its kind and written bytes said
    [(f, indexed)] = [(f, a) for f, a in page.rects if (a["lane"] or "").startswith("cache.index_put_")]
    assert indexed["data-kind"] == "indexed" and indexed["lane"].endswith("(24 B written)")


def _browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(
            "chromium is not installed (Debian's chromium and chromium-driver: `make test` installs them where it "
            "can); the page is still checked as HTML by test_page_of_a_run"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="dealias-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # (chromedriver given: selenium-manager downloads nothing)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options), profile


def test_page_in_a_browser(run_report, tmp_path):
    driver, profile = _browser()
    from selenium.webdriver.common.by import By

    try:
        start = time.perf_counter()
        driver.get((run_report / "index.html").as_uri())
        waited = time.perf_counter() - start
        load_ms = driver.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd")
        print(f"report page: loaded in {load_ms:.0f} ms (navigation timing), {waited:.2f} s as the driver waited")
        assert load_ms < 5000  # loose: the page of a 200-step run opens in well under a second here
        errors = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        # a node's location link shows and highlights its source line
        link = driver.find_elements(By.CSS_SELECTOR, "[data-trace='execution'] a.loc")[0]
        link.click()
        target = driver.find_element(By.ID, link.get_attribute("data-target"))
        assert "hl" in target.get_attribute("class").split() and target.is_displayed()
        line = int(link.text.rsplit(":", 1)[1])
        assert target.get_attribute("data-line") == str(line)
        # a source line highlights the nodes it made, in every trace of its compile
        source = driver.find_element(By.CSS_SELECTOR, ".trace.source .src-line[data-line='24']")
        source.click()
        lit = driver.find_elements(By.CSS_SELECTOR, ".node.hl")
        assert lit and all(n.get_attribute("data-src") == source.get_attribute("id") for n in lit)
        # the KV-cache step's map, as the browser sees it: exactly slot 3 of each head written
        rects = driver.execute_script(
            "return Array.from(document.querySelectorAll('g.lane[data-label^=\"k_cache.select\"] rect.region'))"
            ".map(r => [Number(r.dataset.start), Number(r.dataset.end), r.dataset.kind, r.getBBox().width])"
        )
        assert [tuple(r[:2]) for r in rects] == _kv_slot_bytes() and all(r[2] == "in place" and r[3] > 0 for r in rects)
        # the screenshot: the KV-cache step's compile (its write-back map and traces)
        section = driver.find_element(By.CSS_SELECTOR, "svg.storage-map")
        driver.execute_script("arguments[0].closest('details').scrollIntoView()", section)
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        print(f"screenshot: {shot}")
        if os.environ.get("DEALIAS_UPDATE_SCREENSHOT"):  # the README's picture
            shutil.copy(shot, ROOT / "docs" / "report.png")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t[:, 1],
        lambda t: t.t()[::2],
        lambda t: t[1:, ::3],
        lambda t: t.unsqueeze(0).expand(3, -1, -1)[:, 0],
        lambda t: t.view(-1)[2:9],
        lambda t: t.permute(1, 0)[1:3],
    ],
)
def test_written_bytes_match_eager(view):
    """The map's bytes of a region are those eager writes through the same view (storage_map._spans on a meta
    tensor of the caller's layout, against a real write into the caller's memory)."""
    from dealias.report.storage_map import _meta, _spans

    buffer = torch.zeros(64)
    t = buffer[3:51].view(6, 8)
    view(t).fill_(1)
    assert [tuple(s) for s in _spans(view(_meta(t)))] == _byte_runs(buffer != 0, 4)


def test_fallback_recorded(tmp_path):
    """A graph dealias leaves to eager (its cache_limit reached by a new overlap of its inputs) is on the page with
    the warning's words, and the call still equals eager."""

    def scale(a, b):
        a.mul_(2)
        return b + 1

    try:
        dealias.report(tmp_path)
        jf = dealias.jit(scale, cache_limit=1)
        for sl in (slice(4, 8), slice(2, 6)):  # disjoint, then overlapping: a new layout for dealias, not dynamo
            buf, eager_buf = torch.arange(10.0), torch.arange(10.0)
            with pytest.warns(dealias.FallbackWarning) if sl.start == 2 else contextlib.nullcontext():
                got = jf(buf[:4], buf[sl])
            assert torch.equal(got, scale(eager_buf[:4], eager_buf[sl])) and torch.equal(buf, eager_buf)
        _, page = _page(dealias.report(tmp_path))
    finally:
        records.stop()
    fallbacks = page.items.get("fallback", [])
    assert len(fallbacks) == 1 and "cache_limit" in fallbacks[0][1]


def test_the_tier_a_program_settles_on_is_recorded(tmp_path, monkeypatch):
    # executor "exact" chooses its tier on its calls (frontend/tiers.py): the page says where it runs and why, not
    # only the torch executor it started on.
    from dealias.frontend import tiers

    clock = {"torch": 5e-5, "graph": 2e-5}
    monkeypatch.setattr(tiers, "measure", lambda tier, run, leaves: (run(leaves), clock[tier]))

    def scale_row(buf, s: torch.Tensor):
        buf[1].mul_(s)
        return buf.sum()

    try:
        dealias.report(tmp_path)
        jf = dealias.jit(scale_row, executor="exact")
        buf, eager_buf = torch.ones(4, 3), torch.ones(4, 3)
        for _ in range(20):
            s = torch.tensor(1.5)
            assert torch.equal(jf(buf, s), scale_row(eager_buf, s)) and torch.equal(buf, eager_buf)
        assert dealias.cache_info(jf).tiers == ("graph",)
        text = dealias.report(tmp_path).read_text()
    finally:
        records.stop()
    assert "torch → graph" in text and "runs on: <b class='tier'>graph</b>" in text
    assert "fastest measured: graph 20.0 us vs torch 50.0 us" in text
