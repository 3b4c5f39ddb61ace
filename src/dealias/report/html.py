"""The report page: one self-contained HTML file (inline CSS, SVG and a few lines of script; nothing fetched)
built from the run's records (records.py).

Per function: its compiles and recompiles with their reasons (cache_info's words), graph breaks, fallbacks and
the final cache_info; per compiled program: its inputs, its executor tier and why, what it writes back (bytes
per caller tensor, and the write-back map: storage_map.py), and its traces side by side with the user's source
lines: a node's `file.py:12` links to that line (highlighted when clicked), and a source line highlights the
nodes it made. All user text is escaped.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from html import escape as e
from pathlib import Path
from typing import Any

from .records import INDEX, RECORDS
from .storage_map import KIND_COLORS, svg

_LOCATION = re.compile(r"(\S+?\.py):(\d+)")
_TRACE_ORDER = ("dynamo", "captured", "functional", "execution")


def read_records(directory: Path) -> list[dict[str, Any]]:
    """The events of a run, each process's file in turn (a function's number is its process's: made unique
    here); a line cut short by a crash is skipped."""
    events = []
    for k, path in enumerate(sorted(directory.glob(RECORDS))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if "function" in ev:
                    ev["function"] = f"{k}.{ev['function']}" if k else ev["function"]
                events.append(ev)
    return events


def write_report(directory: Path, path: Path | None = None) -> Path:
    """Render the records in `directory` to `path` (default: directory/index.html); the page's path."""
    out = path if path is not None else directory / INDEX
    if out.suffix != ".html":
        out = out / INDEX
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render(read_records(directory))
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)  # (a reader never sees half a page)
    return out


class _Function:
    def __init__(self, number: int, name: str) -> None:
        self.number, self.name = number, name
        self.where = ""
        self.misses: list[dict[str, Any]] = []
        self.compiles: list[dict[str, Any]] = []
        self.fallbacks: list[dict[str, Any]] = []
        self.breaks: list[str] = []
        self.cache_info: dict[str, Any] = {}
        self.cache_info_when = ""
        self.graphs: dict[Any, int] = {}
        self.sources: dict[str, dict[str, str]] = {}


def _group(events: list[dict[str, Any]]) -> tuple[dict[str, Any], list[_Function]]:
    run: dict[str, Any] = {}
    functions: dict[int, _Function] = {}
    for ev in events:
        kind = ev.get("event")
        if kind == "run":
            run = run or ev
            continue
        if "function" not in ev:
            continue
        f = functions.get(ev["function"])
        if f is None:
            f = functions[ev["function"]] = _Function(ev["function"], ev.get("name", "?"))
        for path, lines in (ev.get("sources") or {}).items():
            f.sources.setdefault(path, {}).update(lines)
        if kind == "miss":
            for c in f.compiles:  # the compiles this call made: dynamo's reason (cache_info's) is theirs
                c.setdefault("miss_reason", ev.get("reason", ""))
            f.misses.append(ev)
            f.cache_info_when = f"at its latest compile, {_clock(ev)}"
            f.where = ev.get("where") or f.where
            f.breaks += ev.get("graph_breaks", [])
            f.cache_info = ev.get("cache_info") or f.cache_info
        elif kind == "compile":
            # graphs numbered per function, in the order they compiled
            ev["graph"] = f.graphs.setdefault(ev.get("graph"), len(f.graphs))
            f.compiles.append(ev)
        elif kind == "tier":  # (the graph's latest compile is the program that chose)
            graph = f.graphs.get(ev.get("graph"))
            chosen = [c for c in f.compiles if c.get("graph") == graph]
            if chosen:
                chosen[-1]["settled"] = ev
        elif kind == "fallback":
            f.fallbacks.append(ev)
        elif kind == "summary":
            f.cache_info = ev.get("cache_info") or f.cache_info
            f.cache_info_when = f"as of {_clock(ev)}"
    return run, list(functions.values())


def _clock(ev: dict[str, Any]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ev.get("t", 0)))


def render(events: list[dict[str, Any]]) -> str:
    run, functions = _group(events)
    compiles = sum(len(f.compiles) for f in functions)
    breaks = sum(len(f.breaks) for f in functions)
    fallbacks = sum(len(f.fallbacks) for f in functions)
    recompiles = sum(max(len(f.misses) - 1, 0) for f in functions)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.get("start", 0))) if run else "?"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>dealias report: {e(' '.join(run.get('argv', [])) or 'run')}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<header><h1>dealias compile report</h1>",
        f"<p class='run'>{e(' '.join(run.get('argv', [])))} · torch {e(str(run.get('torch', '?')))} · "
        f"started {e(started)} · pid {e(str(run.get('pid', '?')))}</p>",
        f"<p class='totals'><b>{len(functions)}</b> functions · <b>{compiles}</b> compiles · "
        f"<b>{recompiles}</b> recompiles · <b>{breaks}</b> graph breaks · <b>{fallbacks}</b> fallbacks</p>",
        _legend(),
        "<nav><ul>",
    ]
    for f in functions:
        flags = []
        if f.breaks:
            flags.append(f"{len(f.breaks)} breaks")
        if f.fallbacks:
            flags.append(f"{len(f.fallbacks)} fallbacks")
        if len(f.misses) > 1:
            flags.append(f"{len(f.misses) - 1} recompiles")
        flag = f" <span class='flags'>{e(', '.join(flags))}</span>" if flags else ""
        parts.append(f"<li><a href='#f{f.number}'>{e(f.name)}</a> · {len(f.compiles)} compiles{flag}</li>")
    parts.append("</ul></nav></header><main>")
    if not functions:
        parts.append("<p class='empty'>No function was compiled by dealias in this run (yet).</p>")
    for f in functions:
        parts.append(_function(f))
    parts.append(f"</main><script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def _legend() -> str:
    items = "".join(
        f"<span class='key'><svg width='12' height='12'><rect width='12' height='12' fill='{c}'/></svg> {e(k)}</span>"
        for k, c in KIND_COLORS.items()
    )
    return f"<p class='legend'>write-back map: {items}</p>"


def _function(f: _Function) -> str:
    out = [f"<section class='function' id='f{f.number}'><h2>{e(f.name)}</h2>"]
    if f.where:
        out.append(f"<p class='where'>defined at {_loc_text(f.where)}</p>")
    if f.cache_info:
        cells = "".join(f"<tr><th>{e(k)}</th><td>{e(_value(v))}</td></tr>" for k, v in f.cache_info.items())
        # (a function freed before the page was written keeps the cache_info of its latest compile)
        when = e(f.cache_info_when)
        out.append(
            f"<details class='cache-info' open><summary>cache_info ({when})</summary><table>{cells}</table></details>"
        )
    if f.misses:
        out.append("<h3>Compiles and recompiles (cache_info's last_miss_reason)</h3><ol class='misses'>")
        for m in f.misses:
            eager = " <b class='warn'>runs eagerly</b>" if m.get("eager") else ""
            out.append(f"<li class='miss'>{e(m.get('reason') or '?')}{eager}</li>")
        out.append("</ol>")
    if f.breaks:
        out.append("<h3>Graph breaks</h3><ul class='breaks'>")
        out += [f"<li class='break'>{_linked(b, f, 'f' + str(f.number))}</li>" for b in f.breaks]
        out.append("</ul>")
    if f.fallbacks:
        out.append("<h3>Fallbacks (run eagerly)</h3><ul class='fallbacks'>")
        for fb in f.fallbacks:
            what = f"{fb.get('error', '')}: {fb.get('message', '')}"
            out.append(f"<li class='fallback'>graph {fb.get('graph')}: {_linked(what, f, 'f' + str(f.number))}</li>")
        out.append("</ul>")
    if f.breaks or f.fallbacks or f.where:
        out.append(_source_block(f.sources, f"f{f.number}"))
    if len(f.compiles) > 1:
        out.append(_compile_times(f.compiles))
    for i, c in enumerate(f.compiles):
        out.append(_compile(f, c, f"f{f.number}c{i}"))
    out.append("</section>")
    return "\n".join(out)


def _compile_times(compiles: list[dict[str, Any]]) -> str:
    """A bar per compile: its passes' time (a recompile that costs as much as the first is worth avoiding)."""
    times = [c.get("compile_seconds", 0.0) * 1e3 for c in compiles]
    top = max(max(times), 1e-3)
    bars = []
    for i, (c, ms) in enumerate(zip(compiles, times)):
        w = 300 * ms / top
        label = f"graph {c.get('graph')} layout {c.get('layout')}"
        bars.append(
            f"<text x='0' y='{i * 16 + 11}'>{e(label)}</text><rect class='time' x='130' y='{i * 16 + 2}' "
            f"width='{w:.1f}' height='11' fill='#5b8fd6' data-ms='{ms:.2f}'/>"
            f"<text x='{136 + w:.1f}' y='{i * 16 + 11}'>{ms:.1f} ms</text>"
        )
    return (
        "<h3>Compile time per compile (passes)</h3><svg class='compile-times' xmlns='http://www.w3.org/2000/svg' "
        f"width='520' height='{len(compiles) * 16 + 4}'>{''.join(bars)}</svg>"
    )


def _compile(f: _Function, c: dict[str, Any], cid: str) -> str:
    # A graph's first layout compiled because the function's call missed (dynamo's reason); a later layout
    # because dealias's own key changed (sharing, offsets, a value outside the shape guard).
    reason = c.get("reason", "") if c.get("layout") else c.get("miss_reason") or c.get("reason", "")
    settled = c.get("settled") or {}
    tier = f"{c.get('tier', '')} → {settled['tier']}" if settled else str(c.get("tier", ""))
    head = (
        f"graph {c.get('graph')} · layout {c.get('layout')} · <span class='reason'>{e(reason)}</span> · "
        f"<span class='tier'>{e(tier)}</span>"
    )
    out = [f"<details class='compile' id='{cid}' open><summary>{head}</summary>"]
    out.append(
        f"<p>executor: <b class='tier'>{e(str(c.get('tier', '')))}</b> — {e(c.get('tier_why', ''))}; "
        f"compile {c.get('compile_seconds', 0) * 1e3:.1f} ms (passes)"
        + (f"; symbolic: {e(', '.join(c['symbolic']))}" if c.get("symbolic") else "")
        + "</p>"
    )
    if settled:  # (executor "tiered"/"exact": the tier its calls chose, measured on them)
        out.append(f"<p class='settled'>runs on: <b class='tier'>{e(settled['tier'])}</b> — {e(settled['why'])}</p>")
    out.append(_inputs(c.get("inputs", [])))
    if c.get("writebacks"):
        rows = "".join(
            f"<tr class='writeback'><td>{e(w['target'])}</td><td>{e(w['mode'])}</td><td class='num'>{w['nbytes']}"
            f"</td><td><code>{e(', '.join(w['regions']))}</code></td></tr>"
            for w in c["writebacks"]
        )
        out.append(
            "<h4>Written back into the caller's tensors</h4><table class='writebacks'><tr><th>tensor</th>"
            f"<th>how</th><th>bytes</th><th>regions</th></tr>{rows}</table>"
        )
    elif c.get("kind") == "program":
        out.append("<p class='none'>writes no caller tensor</p>")
    storages = c.get("storages") or []
    if storages:
        out.append("<h4>Write-back map</h4><div class='maps'>")
        for s in storages:
            title = ", ".join(lane["label"] for lane in s["lanes"] if lane["kind"] == "tensor")
            out.append(svg(s, title))
        out.append("</div>")
    traces = c.get("traces") or []
    if traces:
        out.append("<h4>Traces</h4><div class='traces'>")
        out.append(f"<div class='trace source'><h5>source</h5>{_source_block(c.get('sources', {}), cid)}</div>")
        for t in traces:
            timing = ", ".join(f"{n} {s * 1e3:.1f} ms" for n, s in t.get("passes", []))
            out.append(
                f"<div class='trace' data-trace='{e(t['name'])}'><h5>{e(t['name'])}</h5>"
                + (f"<p class='passes'>{e(timing)}</p>" if timing else "")
                + f"<pre>{_trace_lines(t['text'], cid)}</pre></div>"
            )
        out.append("</div>")
    out.append("</details>")
    return "\n".join(out)


def _inputs(inputs: list[dict[str, Any]]) -> str:
    if not inputs:
        return ""
    rows = []
    for x in inputs:
        if "value" in x:
            rows.append(f"<tr><td>{e(x['name'])}</td><td colspan='4'>{e(x['value'])}</td></tr>")
            continue
        grad = " requires grad" if x.get("requires_grad") else ""
        rows.append(
            f"<tr><td>{e(x['name'])}</td><td>{e(x.get('dtype', ''))}{e(str(x.get('shape', '')))}{grad}</td>"
            f"<td>{e(str(x.get('stride', '')))}</td><td class='num'>{e(str(x.get('offset', '')))}</td>"
            f"<td class='num'>{e(str(x.get('storage_bytes', '')))}</td></tr>"
        )
    return (
        "<details class='inputs'><summary>inputs of the compiling call</summary><table><tr><th>input</th>"
        f"<th>tensor</th><th>strides</th><th>offset</th><th>storage bytes</th></tr>{''.join(rows)}</table></details>"
    )


def _anchor(scope: str, path: str, line: str | int) -> str:
    return f"{scope}-src-{zlib.crc32(path.encode()):08x}-{line}"


def _trace_lines(text: str, cid: str) -> str:
    out = []
    for line in text.splitlines():
        found = _LOCATION.search(line)
        if found is None:
            out.append(f"<span class='line'>{e(line) or ' '}</span>")
            continue
        path, n = found.group(1), found.group(2)
        target = _anchor(cid, path, n)
        # (the source line the comment repeats after the location is the source column's: kept as the title)
        link = (
            f"<a class='loc' href='#{target}' data-target='{target}' title='{e(path)}:{n} {e(line[found.end() :])}'>"
            f"{e(os.path.basename(path))}:{n}</a>"
        )
        out.append(f"<span class='line node' data-src='{target}'>{e(line[: found.start()].rstrip())}  {link}</span>")
    return "".join(out)  # (each line a block)


def _source_block(sources: dict[str, dict[str, str]], scope: str) -> str:
    out = ["<div class='sources'>"]
    for path, lines in sources.items():
        out.append(f"<div class='file'><div class='path'>{e(path)}</div><pre>")
        previous = None
        for n in sorted(lines, key=int):
            if previous is not None and int(n) != previous + 1:
                out.append("<span class='gap'>   ⋮</span>")
            anchor = _anchor(scope, path, n)
            out.append(f"<span class='src-line' id='{anchor}' data-line='{n}'>{int(n):5d}  {e(lines[n])}</span>")
            previous = int(n)
        out.append("</pre></div>")
    out.append("</div>")
    return "".join(out)


def _linked(text: str, f: _Function, scope: str) -> str:
    """Escaped text whose `file.py:12` mentions link to the function's source block."""
    out, last = [], 0
    for m in _LOCATION.finditer(text):
        out.append(e(text[last : m.start()]))
        target = _anchor(scope, m.group(1), m.group(2))
        out.append(
            f"<a class='loc' href='#{target}' data-target='{target}'>{e(os.path.basename(m.group(1)))}:{m.group(2)}</a>"
        )
        last = m.end()
    out.append(e(text[last:]))
    return "".join(out)


def _loc_text(where: str) -> str:
    return e(where)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v) or "()"
    return str(v)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:12px 20px;background:#1f2d3d;color:#eee}header a{color:#9cd}
h1{margin:0 0 4px;font-size:20px}h2{margin:0 0 6px;font-size:18px}h3{font-size:15px;margin:12px 0 4px}
h4{font-size:14px;margin:10px 0 4px}h5{margin:0 0 4px;font-size:13px;color:#555}
main{padding:12px 20px}nav ul{margin:6px 0;padding-left:18px;columns:2}.flags{color:#f7b267}
section.function{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:0 0 16px}
details.compile{border-top:1px solid #eee;padding:6px 0}summary{cursor:pointer}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
td.num{text-align:right}.warn{color:#c0392b}.legend .key{margin-right:10px;white-space:nowrap}
.traces{display:flex;gap:8px;overflow-x:auto;align-items:flex-start}
.trace{flex:0 0 auto;max-width:680px;min-width:320px;border:1px solid #e3e3e3;border-radius:4px;padding:4px;
background:#fcfcfc}
.trace[data-trace='dynamo']{max-width:460px}
.trace.source{position:sticky;left:0;z-index:1;max-width:440px;overflow-x:auto;box-shadow:2px 0 4px #0001}
.trace pre{margin:0;font:11px/1.45 ui-monospace,monospace;overflow-x:auto}
.trace .line{display:block;white-space:pre}.node.hl{background:#fff3b0}
.sources pre{margin:0;font:11px/1.45 ui-monospace,monospace}.sources .path{font-size:11px;color:#666}
.src-line{display:block;white-space:pre}.src-line.hl{background:#ffe27a;outline:1px solid #e0b000}
.gap{display:block;color:#aaa}a.loc{color:#1a5fb4}.passes{font-size:11px;color:#777;margin:0 0 2px}
svg.storage-map{display:block;margin:4px 0 10px;font:11px system-ui,sans-serif}
svg .bar{fill:#f1f1f1;stroke:#ccc}
svg.compile-times{font:11px system-ui,sans-serif;display:block}svg .axis{fill:#555}svg .lane-label{fill:#222}
"""

# Clicking a node's location shows and highlights its source line; clicking a source line highlights the
# nodes it made (in every trace of that compile).
_SCRIPT = """
(function(){
  function clear(scope, cls){ scope.querySelectorAll('.'+cls).forEach(function(x){x.classList.remove(cls);}); }
  document.addEventListener('click', function(ev){
    var a = ev.target.closest('a.loc');
    if (a) {
      var t = document.getElementById(a.getAttribute('data-target'));
      if (t) {
        ev.preventDefault();
        var d = t.closest('details'); if (d) d.open = true;
        clear(document, 'hl');
        t.classList.add('hl');
        t.scrollIntoView({block: 'center'});
        history.replaceState(null, '', '#' + t.id);
      }
      return;
    }
    var s = ev.target.closest('.src-line');
    if (s) {
      clear(document, 'hl');
      s.classList.add('hl');
      document.querySelectorAll('[data-src="' + s.id + '"]').forEach(function(n){n.classList.add('hl');});
    }
  });
})();
"""
