"""HTML building blocks of the report: escaping, tables, figure slots, page shell, selector script.

The page is one file: CSS and plotly's JavaScript are inlined, figure data sits in JSON script tags, and
every table is plain HTML so the numbers read without JavaScript (the PNG figures show in <noscript>).
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from phasekv.io import jsonable

esc = html.escape


def fmt(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or v is pd.NA:
        return "–"
    if isinstance(v, bool | np.bool_):
        return "yes" if v else "no"
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    if isinstance(v, float | np.floating):
        return f"{float(v):.{digits}f}"
    return esc(str(v))


def table(headers: list[str], rows: list[list[str]], row_models: list[str | None] | None = None,
          cls: str = "") -> str:
    """An HTML table; cells are pre-formatted HTML; rows tagged with data-model are selectable."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        model = row_models[i] if row_models else None
        attr = f' data-model="{esc(model)}" tabindex="0"' if model else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def figure(fig_id: str, spec: dict, caption: str, png: str | None) -> str:
    """A plotly figure slot (data in a JSON script tag), its caption, its PNG link and a no-JS fallback."""
    data = json.dumps(jsonable(spec), separators=(",", ":")).replace("</", "<\\/")
    link = f' <a href="{esc(png)}">PNG</a>' if png else ""
    fallback = f'<noscript><img src="{esc(png)}" alt="{esc(caption)}"></noscript>' if png else ""
    return (f'<figure><div class="pkv-plot" id="{fig_id}"></div>'
            f'<script type="application/json" class="pkv-spec" data-target="{fig_id}">{data}</script>'
            f"{fallback}<figcaption>{caption}{link}</figcaption></figure>")


def image(path: Path, caption: str, png: str | None = None) -> str:
    """A PNG embedded as a data URI (so the page stays one self-contained file)."""
    b64 = base64.b64encode(path.read_bytes()).decode()
    link = f' <a href="{esc(png)}">PNG</a>' if png else ""
    return (f'<figure><img class="static" src="data:image/png;base64,{b64}" alt="{esc(caption)}">'
            f"<figcaption>{caption}{link}</figcaption></figure>")


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:0 24px 60px}
header{background:#12263a;color:#fff;padding:22px 24px}
header h1{margin:0 0 6px;font-size:24px} header p{margin:2px 0;opacity:.85}
h2{border-bottom:2px solid #12263a;padding-bottom:4px;margin-top:38px} h3{margin-top:24px}
table{border-collapse:collapse;margin:10px 0;font-size:13px;background:#fff}
th,td{border:1px solid #d6d6d6;padding:4px 8px;text-align:right} th{background:#eef1f4}
td:first-child,th:first-child{text-align:left} table.checks td,table.checks th{text-align:left}
tr[data-model]{cursor:pointer} tr.dim td{color:#aaa} tr.sel td{background:#fff6d6}
.published{color:#6a4c93;font-style:italic} th.published{background:#efe9f7}
.pass{color:#1a7f37;font-weight:600} .fail{color:#b3261e;font-weight:600} .na{color:#777}
#model-selector{position:sticky;top:0;z-index:10;background:#fafafaee;padding:8px 0;border-bottom:1px solid #ddd}
#model-selector button{margin:2px 4px 2px 0;padding:4px 10px;border:1px solid #999;border-radius:14px;background:#fff;
cursor:pointer;font-size:13px} #model-selector button.active{background:#12263a;color:#fff;border-color:#12263a}
#model-selector .swatch{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:5px}
figure{margin:12px 0;background:#fff;border:1px solid #e3e3e3;padding:6px} figcaption{font-size:13px;color:#444;padding:4px}
img.static{max-width:100%} .prompt{font-family:ui-monospace,Menlo,monospace;font-size:12px;line-height:1.7;
background:#fff;border:1px solid #ddd;padding:8px;max-height:160px;overflow:auto}
.prompt mark.target{background:#ffd54f} .prompt mark.answer{background:#a5d6a7} .prompt mark.query{background:#90caf9}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:8px 12px;font-size:14px}
.missing{color:#777;font-style:italic} nav.toc a{margin-right:12px;font-size:14px}
"""

SCRIPT = """
(function(){
  const GREY_LINE = '#c8c8c8', GREY_FILL = 'rgba(190,190,190,0.12)';
  function plotAll(){
    document.querySelectorAll('script.pkv-spec').forEach(function(s){
      const spec = JSON.parse(s.textContent), div = document.getElementById(s.dataset.target);
      Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false});
    });
  }
  function select(model){
    document.querySelectorAll('#model-selector button').forEach(function(b){
      b.classList.toggle('active', b.dataset.model === model); });
    document.querySelectorAll('tr[data-model]').forEach(function(r){
      r.classList.toggle('dim', model !== 'all' && r.dataset.model !== model);
      r.classList.toggle('sel', model !== 'all' && r.dataset.model === model); });
    document.querySelectorAll('.pkv-plot').forEach(function(div){
      if (!div.data) return;
      const idx = [], line = [], marker = [], fill = [], opacity = [];
      div.data.forEach(function(t, i){
        const m = t.meta; if (!m || !m.model) return;
        const on = model === 'all' || m.model === model;
        idx.push(i); line.push(on ? m.color : GREY_LINE); marker.push(on ? m.color : GREY_LINE);
        fill.push(on ? m.fill : GREY_FILL); opacity.push(on ? 1 : 0.55);
      });
      if (idx.length) Plotly.restyle(div, {'line.color': line, 'marker.color': marker, 'fillcolor': fill,
                                           'opacity': opacity}, idx);
      const b = div.layout.meta && div.layout.meta.boundaries;
      if (b) Plotly.relayout(div, {shapes: (model in b) ? b[model] : []});
    });
    document.body.dataset.selected = model;
  }
  window.pkvSelect = select;
  document.addEventListener('DOMContentLoaded', function(){
    plotAll();
    document.querySelectorAll('#model-selector button').forEach(function(b){
      b.addEventListener('click', function(){ select(b.dataset.model); }); });
    document.querySelectorAll('tr[data-model]').forEach(function(r){
      r.addEventListener('click', function(){ select(r.dataset.model); });
      r.addEventListener('keydown', function(e){ if (e.key === 'Enter') select(r.dataset.model); }); });
    select('all');
  });
})();
"""


def page(title: str, header: str, body: str, plotly_js: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(title)}</title>"
        f"<style>{CSS}</style><script>{plotly_js}</script><script>{SCRIPT}</script></head>"
        f"<body><header>{header}</header><main>{body}</main></body></html>\n"
    )
