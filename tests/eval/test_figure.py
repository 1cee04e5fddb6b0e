"""Figures as data: one spec, two renderers (plotly dict for the report, matplotlib PNG)."""

from phasekv.eval.figure import Figure, Guide, Panel, Trace, to_plotly, to_png


def _figure() -> Figure:
    traces = [Trace("band", [0, 1, 2], [1, 2, 3], [3, 4, 5], color="#d62728", model="a"),
              Trace("line", [0, 1, 2], [2, 3, 4], name="model a", color="#d62728", marker="circle", model="a"),
              Trace("line", [0, 1, 2], [5, 5, 5], name="model b", color="#222222", model="b")]
    panel = Panel(traces, xlabel="residue", ylabel="accuracy (%)", facet=True, reference="b",
                  facet_titles={"a": "A", "b": "B"}, model_guides={"a": [Guide(x=0.5)], "b": []})
    heat = Panel([Trace("heatmap", [0, 1], ["row 0", "row 1"], z=[[0.1, 0.9], [0.5, None]], scale="greens",
                        zrange=(0, 1), text=[["0.10", "0.90"], ["0.50", ""]], colorbar="R²")])
    return Figure([panel], "one panel per model on paper"), Figure([heat], "a heatmap")


def test_plotly_keeps_models_for_the_selector():
    lines, heat = (to_plotly(f) for f in _figure())
    models = [t.get("meta", {}).get("model") for t in lines["data"]]
    assert models == ["a", "a", "a", "b"]  # a band is two traces (its upper edge, then the fill)
    assert lines["data"][1]["fill"] == "tonexty" and lines["data"][1]["meta"]["role"] == "band"
    bounds = lines["layout"]["meta"]["boundaries"]
    assert bounds["all"] == [] and len(bounds["a"]) == 1 and bounds["a"][0]["x0"] == 0.5 and bounds["b"] == []
    assert lines["layout"]["title"]["text"] == "one panel per model on paper"
    h = heat["data"][0]
    assert h["type"] == "heatmap" and h["zmin"] == 0 and h["colorbar"]["title"]["text"] == "R²"
    assert heat["layout"]["yaxis"]["autorange"] == "reversed"  # first row on top, as on paper


def test_png_draws_every_panel(tmp_path):
    for i, fig in enumerate(_figure()):
        path = to_png(fig, tmp_path / f"f{i}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0.png", "f1.png"]  # no temp file left
