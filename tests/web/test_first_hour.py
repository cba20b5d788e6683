"""What a new user sees first, read back from what Chromium drew (issue 31): a stored run
opened cold from its URL draws its loss and learning-rate lines (the SVG paths of those
subplots, not the figure's data), on the page and in the PNG export; at 1280×720 and
1440×900 the run list's names and dates are whole, no two tick labels of a panel collide
(linear or log scale), and the export's legend stays clear of its subtitle and plot.
"""

from __future__ import annotations

import json
import math
import urllib.request
from typing import Any

import pytest

from gradwatch.wire import End, Step
from tests.serverproc import ServerProc

from .conftest import ARTIFACTS, Page
from .dash import header, ingest, optimizer, steps, wait_for

pytestmark = pytest.mark.browser

N = 200

# The points of each drawn line of a subplot ("xy3": the step axis and the third y axis):
# plotly draws a trace's line as one <path class="js-line" d="M..L..L..">.
DRAWN = """([root, subplot]) => Array.from(document.querySelectorAll(
    `${root} .cartesianlayer .subplot.${subplot} .scatterlayer .trace path.js-line`))
  .map(p => (p.getAttribute('d') || '').split(/[ML]/).filter(s => s.trim()).length)"""

# The export as drawn: the run's PNG figure (exporting.runFigure) plotted in a box the size
# of the PNG, so its SVG can be read like the page's.
EXPORT = """async () => {
  const { drawFigure, runFigure } = await import('/static/js/exporting.js');
  const run = { id: 'cold', name: document.getElementById('run-name').textContent,
                status: 'finished', steps: 200, started: 1700000000 };
  const fig = runFigure(document.getElementById('chart'), run, 0,
                        window.gradwatch.view.optimizers);
  let box = document.getElementById('export-probe');
  if (box) { window.Plotly.purge(box); box.remove(); }
  box = document.createElement('div');
  box.id = 'export-probe';
  box.style.cssText = `position:absolute;left:0;top:0;width:${fig.layout.width}px;` +
    `height:${fig.layout.height}px`;
  document.body.append(box);
  await drawFigure(box, fig);
  return fig.layout.width; }"""


def lossy(n: int) -> list[Step]:
    """Steps with a falling, noisy loss and a cosine learning-rate schedule."""
    out = []
    for s in steps(n):
        i = s.step
        s.loss = 2.0 * math.exp(-i / 60) + 0.1 * math.sin(i * 1.7)
        s.lr = [0.1 * 0.5 * (1 + math.cos(math.pi * i / n))]
        out.append(s)
    return out


LONG_NAMES = ["bert-base-finetune-squad-v2-lr3e-5-warmup0.1-seed42",
              "resnet50_imagenet_bs256_cosine_lr0.1_wd1e-4_epochs90_mixed-precision"]
SIZES = [{"width": 1280, "height": 720}, {"width": 1440, "height": 900}]


ARGV = ["train.py", "--lr", "0.1", "--name", "my run"]
HPARAMS = [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0001, "nesterov": True},
           {"lr": 0.5, "betas": [0.8, 0.95], "foreach": None}]


async def stored_run(server: ServerProc) -> None:
    sent = lossy(N)
    head = header("cold", "cold-start")
    head.argv = ARGV
    opt = optimizer()
    opt.hparams = HPARAMS
    await ingest(server.ws, "cold", [head, opt, *sent,
                                     End(seq=sent[-1].seq + 1, t=sent[-1].t + 1, steps=N)])
    for k, name in enumerate(LONG_NAMES):
        few = steps(30, missed=(10, 20) if k else None)
        await ingest(server.ws, f"long{k}", [
            header(f"long{k}", name, t=1_700_000_000.0 + 3600 * (k + 1)), optimizer(), *few,
            End(seq=few[-1].seq + 1, t=few[-1].t + 1, steps=30)])


async def drawn_points(page: Any, root: str, subplot: str) -> list[int]:
    return await page.evaluate(DRAWN, [root, subplot])


async def test_a_stored_run_opened_cold_draws_its_loss_and_lr_lines_and_reads_cleanly(
        server: ServerProc, page: Page) -> None:
    await stored_run(server)
    await page.goto(f"{server.http}/?run=cold")

    async def lines() -> dict[str, list[int]] | None:
        got = {s: await drawn_points(page, "#chart", s) for s in ("xy", "xy3", "xy4")}
        return got if got["xy"] and max(got["xy"]) > 0 else None

    got = await wait_for(lines, timeout=30)
    # The norm panel draws its lines, and so do the loss (y3) and lr (y4) panels, with a
    # point per step (the loss wiggles: plotly cannot merge its points).
    assert max(got["xy"]) >= N // 2, got
    assert got["xy3"] and max(got["xy3"]) >= N // 2, f"loss panel drawn empty: {got}"
    assert got["xy4"] and max(got["xy4"]) >= 10, f"lr panel drawn empty: {got}"

    # The run's configuration: its command line, and each param group's settings.
    await wait_for(lambda: page.locator("#run-command").text_content())
    assert await page.locator("#run-command").text_content() == \
        "train.py --lr 0.1 --name 'my run'"
    await page.locator("#run-config summary").click()
    groups = await page.locator("#run-hparams li").all_text_contents()
    assert groups == [
        "SGD#0 · SGD · group 0lr 0.1 · momentum 0.9 · weight_decay 0.0001 · nesterov True",
        "SGD#0 · SGD · group 1lr 0.5 · betas (0.8, 0.95) · foreach None"], groups
    await page.locator("#run-config summary").click()

    # The PNG export has the same lines (no empty band where the loss was), and its legend
    # lies between the subtitle and the plot, touching neither.
    await page.evaluate(EXPORT)
    exported = {s: await drawn_points(page, "#export-probe", s) for s in ("xy3", "xy4")}
    assert max(exported["xy3"]) >= N // 2 and max(exported["xy4"]) >= 10, exported
    (sub,) = await page.evaluate(BOXES, "#export-probe .gtitle-subtitle")
    (legend,) = await page.evaluate(BOXES, "#export-probe .legend")
    plot = await page.evaluate("""() => { const box = document.getElementById('export-probe');
      return {y: box.getBoundingClientRect().top + box._fullLayout.yaxis._offset}; }""")
    assert "run cold" in sub["text"] and "200 steps" in sub["text"]
    assert sub["y"] + sub["h"] <= legend["y"], (sub, legend)
    assert legend["y"] + legend["h"] <= plot["y"], (legend, plot)
    assert "cold-start" in await page.evaluate(
        "() => document.querySelector('#export-probe .gtitle').textContent")
    # and its subtitle carries the run's configuration, as the facts box shows it
    assert "SGD lr 0.1 · momentum 0.9 · weight_decay 0.0001 · nesterov True (+1 group)" \
        in sub["text"], sub
    await page.locator("#export-probe").screenshot(
        path=str(ARTIFACTS / "web-first-hour-export.png"))
    await page.evaluate("() => document.getElementById('export-probe').remove()")

    # Smoothing: the ‖grad‖ and loss lines get TensorBoard's debiased EMA on top, the raw
    # lines faint behind; read back from the drawn paths, to half a pixel.
    sent = lossy(N)
    await page.locator("#rng-smooth").fill("0.6")
    assert "smooth=0.6" in page.url

    async def smoothed() -> list[Any] | None:
        norm = await page.evaluate(DRAWN_DATA, ["#chart", "xaxis", "yaxis"])
        loss = await page.evaluate(DRAWN_DATA, ["#chart", "xaxis", "yaxis3"])
        return (norm, loss) if len(norm) == 3 and len(loss) == 2 and all(
            t["points"] for t in (norm[2], loss[1])) else None

    norm, loss = await wait_for(smoothed)
    for (raw, smooth), col in (((norm[0], norm[2]), [st.norm for st in sent]),
                               ((loss[0], loss[1]), [st.loss for st in sent])):
        want = tensorboard_ema([float(v) for v in col], 0.6)
        assert len(smooth["points"]) >= N // 2
        tol = smooth["tol"]
        bad = [b for b in off_by(smooth["points"], want) if abs(b[1] - b[2]) > tol]
        assert bad == [], bad[:5]
        # the raw line is still drawn, faint; the smoothed one is not the raw one
        assert raw["opacity"] < 0.5 <= smooth["opacity"] and len(raw["points"]) >= N // 2
        assert off_by(smooth["points"], [float(v) for v in col])
    await page.screenshot(path=str(ARTIFACTS / "web-first-hour-smoothed.png"))
    await page.locator("#rng-smooth").fill("0")

    async def raw_again() -> bool:
        norm = await page.evaluate(DRAWN_DATA, ["#chart", "xaxis", "yaxis"])
        return len(norm) == 2 and norm[0]["opacity"] == 1  # ‖grad‖ and fresh only

    await wait_for(raw_again)
    assert "smooth=" not in page.url

    # The x axis as time since the first step (each step record's time; these steps are
    # 10 ms apart), then as the wall clock, read back from the drawn ‖grad‖ line; a zoom
    # on the time axis is a window of steps (in the URL).
    await page.locator("#sel-x").select_option("relative")

    async def timed() -> list[Any] | None:
        title = await page.evaluate(
            "() => document.getElementById('chart')._fullLayout.xaxis.title.text")
        norm = await page.evaluate(DRAWN_DATA, ["#chart", "xaxis", "yaxis"])
        return norm if "time since" in title and norm[0]["points"] else None

    norm = await wait_for(timed)
    xs = [x for x, _ in norm[0]["points"]]
    assert xs[0] == pytest.approx(0, abs=1e-3) and xs[-1] == pytest.approx(1.99, abs=1e-3)
    assert all(abs(x * 100 - round(x * 100)) < 0.05 for x in xs)  # on the 10 ms grid
    assert "x=relative" in page.url
    await page.evaluate("""() => window.Plotly.relayout(document.getElementById('chart'),
      {'xaxis.range': [0.5, 1.0], 'xaxis.autorange': false})""")
    await wait_for(lambda: page.evaluate("() => location.search.includes('zoom=50,100')"))
    await page.locator("#btn-reset").click()
    await wait_for(lambda: page.evaluate("() => !location.search.includes('zoom=')"))

    async def whole() -> bool:  # the reset's refetch drawn, not the zoom's window
        xs = [x for x, _ in (await page.evaluate(DRAWN_DATA, ["#chart", "xaxis", "yaxis"])
                             )[0]["points"]]
        return bool(xs) and abs(xs[0]) < 1e-3 and abs(xs[-1] - 1.99) < 1e-3

    await wait_for(whole)
    await page.locator("#sel-x").select_option("wall")

    async def walled() -> list[Any] | None:
        kind = await page.evaluate(
            "() => document.getElementById('chart')._fullLayout.xaxis.type")
        norm = await page.evaluate(DRAWN_DATA, ["#chart", "xaxis", "yaxis"])
        return norm if kind == "date" and norm[0]["points"] else None

    norm = await wait_for(walled)
    await page.screenshot(path=str(ARTIFACTS / "web-first-hour-wall-clock.png"))
    shift = await page.evaluate("() => new Date(1700000000000).getTimezoneOffset() * 60000")
    first = norm[0]["points"][0][0]
    assert first == pytest.approx(1_700_000_000_000 - shift, abs=2)
    await page.locator("#sel-x").select_option("step")

    for size in SIZES:
        await page.set_viewport_size(size)
        tag = f"{size['width']}x{size['height']}"
        # The run list: every name whole (wrapped, never cut), its full name on hover, and
        # its steps, findings and start date each whole inside the list.
        for name in LONG_NAMES:
            item = page.locator("#runs .name", has_text=name)
            assert await item.text_content() == name
            assert name in await item.get_attribute("title")
        rows = await page.evaluate("""() => Array.from(document.querySelectorAll('#runs li'))
          .map(li => { const r = li.getBoundingClientRect();
            return Array.from(li.querySelectorAll('.name, .meta > span')).map(e => {
              const b = e.getBoundingClientRect();
              return {text: e.textContent, sw: e.scrollWidth, cw: e.clientWidth,
                      inside: b.left >= r.left - 0.5 && b.right <= r.right + 0.5 && b.width > 0};
            }); })""")
        assert len(rows) == 3
        for row in rows:
            for part in row:
                assert part["inside"] and part["sw"] <= part["cw"] + 1, (tag, part)
            assert any(p["text"].startswith("2023") or "ago" in p["text"] or ":" in p["text"]
                       for p in row[1:]), row  # the start date is one of the parts

        for log in (False, True):
            if await page.locator("#chk-log").is_checked() != log:
                await page.locator("#chk-log").click()

            async def settled(log: bool = log) -> dict[str, list[dict[str, Any]]] | None:
                kind = await page.evaluate(
                    "() => document.getElementById('chart')._fullLayout.yaxis3.type")
                ticks = await page.evaluate(TICKS, "#chart")
                want = {"y", "y2", "y3", "y4"}
                return ticks if want <= set(ticks) and kind == ("log" if log else "linear") \
                    else None

            await page.wait_for_timeout(400)  # the resize redraw, the log relayout
            ticks = await wait_for(settled)
            for ax, labels in ticks.items():
                # Each panel (not the event strip, "y6") says at least two values; a short
                # log panel spanning decades has room for one power of ten.
                assert ax == "y6" or len(labels) >= (1 if log and ax == "y4" else 2), \
                    (tag, log, ax, labels)
                assert crowded(labels) == [], (tag, log, ax, crowded(labels))
            scale = "log" if log else "lin"
            await page.screenshot(path=str(ARTIFACTS / f"web-first-hour-{tag}-{scale}.png"))

    # Notes and tags: typed on the run page, saved on leaving the field, shown as chips in
    # the run list, found by its search, and in the run's step-log export.
    await page.locator("#run-tags").fill("baseline, warm-up , baseline")
    await page.locator("#run-notes-text").fill("warm-up too short?\nloss flat after 150")
    await page.locator("#run-search").click()  # leaving both fields saves them
    await wait_for(lambda: page.locator("#notes-state").text_content(), timeout=10)
    item = page.locator("#runs li[data-run='cold']")
    await wait_for(lambda: item.locator(".tag").all_text_contents())
    assert await item.locator(".tag").all_text_contents() == ["baseline", "warm-up"]
    assert await page.locator("#run-tags").input_value() == "baseline, warm-up"
    for query, shown in (("warm-up", ["cold"]), ("FLAT AFTER", ["cold"]), ("squad", ["long0"])):
        await page.locator("#run-search").fill(query)

        async def found(shown: list[str] = shown) -> list[str] | None:
            visible = await page.evaluate("""() => Array.from(document.querySelectorAll(
              '#runs li')).filter(li => !li.hidden).map(li => li.dataset.run)""")
            return visible if visible == shown else None

        await wait_for(found, timeout=10)
    await page.locator("#run-search").fill("")
    assert "loss flat after 150" in (await item.locator(".name").get_attribute("title"))
    with urllib.request.urlopen(f"{server.http}/api/runs/cold/export?format=jsonl") as r:
        head = json.loads(r.readline())
    assert head["type"] == "header" and head["tags"] == ["baseline", "warm-up"]
    assert head["notes"] == "warm-up too short?\nloss flat after 150"
    assert head["argv"] == ARGV  # and the configuration
    with urllib.request.urlopen(f"{server.http}/api/runs/cold/export?format=jsonl") as r:
        (opt,) = [d for d in map(json.loads, r) if d["type"] == "optimizer"]
    assert opt["hparams"] == HPARAMS
    await page.screenshot(path=str(ARTIFACTS / "web-first-hour-notes.png"))
    assert page.errors == []


# Boxes of what a user reads, for the geometry checks below.
BOXES = """sel => Array.from(document.querySelectorAll(sel)).filter(e => e.getClientRects().length)
  .map(e => { const r = e.getBoundingClientRect();
    return {x: r.x, y: r.y, w: r.width, h: r.height, text: e.textContent,
            sw: e.scrollWidth, cw: e.clientWidth}; })"""

# The y tick labels of each panel of a figure, per axis ("y", "y2", ...).
TICKS = """root => { const out = {};
  for (const t of document.querySelectorAll(`${root} .yaxislayer-above .ytick text, ` +
      `${root} .yaxislayer-above [class*="tick"] text`)) {
    const g = t.closest('g[class$="tick"]');
    const ax = g ? g.getAttribute('class').replace('tick', '') : '?';
    const r = t.getBoundingClientRect();
    if (!r.height || !t.textContent) continue;
    (out[ax] = out[ax] || []).push({y: r.y, h: r.height, text: t.textContent});
  }
  return out; }"""


# Each drawn line of a subplot as data points: the path's pixels mapped back through the
# subplot's axes (the path is drawn in the plot area's own coordinates), and its opacity.
DRAWN_DATA = """([root, xa, ya]) => { const gd = document.querySelector(root);
  const X = gd._fullLayout[xa], Y = gd._fullLayout[ya];
  const sub = 'x' + (ya === 'yaxis' ? 'y' : 'y' + ya.slice(5));
  return Array.from(gd.querySelectorAll(`.subplot.${sub} .scatterlayer .trace`)).map(g => {
    const p = g.querySelector('path.js-line');
    const pts = ((p && p.getAttribute('d')) || '').split(/[ML]/).filter(s => s.trim())
      .map(s => s.split(',').map(Number)).map(([px, py]) => [X.p2c(px), Y.p2c(py)]);
    return {opacity: Number(getComputedStyle(g).opacity), points: pts,
            tol: Math.abs(Y.p2c(0) - Y.p2c(0.5))}; }); }"""


def tensorboard_ema(values: list[float], w: float) -> list[float]:
    """TensorBoard's debiased EMA, written out plainly."""
    out, last = [], 0.0
    for n, v in enumerate(values, start=1):
        last = last * w + (1 - w) * v
        out.append(last / (1 - w ** n))
    return out


def off_by(drawn: list[list[float]], want: list[float]) -> list[tuple[float, float, float]]:
    """Drawn points that are not on the reference line (step, drawn, wanted)."""
    bad = []
    for x, y in drawn:
        i = round(x)
        if abs(x - i) > 0.05 or not 0 <= i < len(want) or abs(y - want[i]) > 1e-9:
            bad.append((x, y, want[i] if 0 <= i < len(want) else math.nan))
    return bad


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def crowded(ticks: list[dict[str, float]]) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis that overlap vertically."""
    ts = sorted(ticks, key=lambda t: t["y"])
    return [(a["text"], b["text"]) for a, b in zip(ts, ts[1:], strict=False)
            if b["y"] < a["y"] + a["h"] - 0.5]
