/**
 * The run's main figure: the panels of panels.js (gradient norm and fresh norm, drift with
 * its 1.0 line; the loss, learning rate and logged values when the run has them) and a
 * strip of reset events, on one shared step axis so zoom and pan move them all; finding
 * bands over the steps they cover, and the player's step cursor.
 *
 * Until plotly.js has started, a canvas preview of the same panels is shown.
 */

import { EVENT_ROWS, N_FIXED, STALE_OVERLAY, emptyPoints, eventPoints, usedRows } from "./events.js";
import { LiveFigure } from "./figure.js";
import { plotText, plottable } from "./format.js";
import { chartLayout, chartShapes, findingShapes } from "./layout.js";
import { renderLegend } from "./legend.js";
import { loadPlotly, whenPlotly } from "./loadplotly.js";
import { PANELS, axisId, panelIndex, panelTraces, shownPanels, traceValues } from "./panels.js";
import { drawPreview } from "./preview.js";
import { compact } from "./series.js";
import { XAxis } from "./xaxis.js";

/** Rows per series above which live data is compacted (to half of it). */
const LIVE_CAP = 4000;
/** Least time between two redraws of the finding shading. */
const SHAPES_GAP_MS = 1000;
/** Traces per series: one per trace spec of every panel. */
const PER_SERIES = PANELS.reduce((n, p) => n + p.traces.length, 0);

const PALETTE = ["#5aa9ff", "#f2b84b", "#3fcf8e", "#ff7b9c", "#b58cff", "#4dd4e0",
  "#d4d45a", "#ff9b5a"];

export class MainChart extends LiveFigure {
  /**
   * @param {HTMLElement} gd the graph div
   * @param {{onRange: (range: number[]|null, byUser: boolean) => void}} hooks
   * @param {HTMLElement|null} legend the box of the HTML legend
   */
  constructor(gd, hooks, legend = null) {
    super(gd, hooks);
    this.legend = legend;
    this.series = new Map();
    this.order = []; // series keys in trace order
    this.rows = []; // strip rows shown (event kinds the run has)
    this.findingList = [];
    this.activeKey = null;
    this.keyOf = null;
    this.bands = [];
    this.shapesTimer = 0;
    this.shapesAt = 0;
    this.preview = null;
    this.cursor = null;
    this.colors = new Map(); // series key -> colour, kept for the life of the view
    this.shown = PANELS.map((p) => !p.optional); // panels drawn (shownPanels)
    this.scalars = new Map(); // logged name -> {x: steps, y: values}, in step order
    this.smoothing = 0; // EMA weight of the smoothed lines (smoothing.js); 0: raw only
    this.xmode = "step"; // what the x axis counts (xaxis.js); ranges stay in steps
    this.xaxis = new XAxis("step", []);
    this.optName = null; // the run's one optimizer as findings name it (the resets row)
    this.optLabels = new Map(); // optimizer id -> its label, as findings name it (legend)
  }

  /** Count the x axis in steps, time since the first step or wall-clock time; redraw. */
  setXMode(mode) {
    if (mode === this.xmode) return Promise.resolve();
    this.xmode = mode;
    return this.ready ? this.redraw() : Promise.resolve();
  }

  toX(range) {
    return this.xaxis.toX(range);
  }

  fromX(range) {
    // A date axis reports its window as "YYYY-MM-DD hh:mm:ss.sss" (our shifted UTC).
    return range && this.xaxis.fromX(range.map((v) => (typeof v === "string"
      ? Date.parse(`${v.replace(" ", "T")}Z`) : Number(v))));
  }

  /** The finding bands and the cursor, on the x axis as it counts now. */
  xShapes() {
    const xa = this.xaxis;
    const bands = xa.isStep ? this.bands
      : this.bands.map((b) => ({ ...b, x0: xa.ofStep(b.x0), x1: xa.ofStep(b.x1) }));
    return chartShapes(bands, this.cursor === null ? null : xa.ofStep(this.cursor));
  }

  /** Event points of series `s` (rows [from, to)) into `pts`, on the x axis as it counts. */
  events(s, from, to, pts, pos) {
    const lens = pts.map((p) => p.x.length);
    eventPoints(s, from, to, pts, pos);
    if (this.xaxis.isStep) return;
    pts.forEach((p, k) => {
      for (let j = lens[k]; j < p.x.length; j++) p.x[j] = this.xaxis.ofStep(p.x[j], s);
    });
  }

  /** Smooth the ‖grad‖ and loss lines with EMA weight `w` (0: off) and redraw. */
  setSmoothing(w) {
    if (w === this.smoothing) return Promise.resolve();
    this.smoothing = w;
    return this.ready ? this.redraw() : Promise.resolve();
  }

  /**
   * Name the resets row after the run's optimizer (null: several, or none known) and the
   * legend's lines after each optimizer's label (`labels`: id -> label, runview.labelsOf).
   */
  setOptNames(name, labels) {
    const same = name === this.optName && labels.size === this.optLabels.size &&
      [...labels].every(([k, v]) => this.optLabels.get(k) === v);
    if (same) return;
    this.optName = name;
    this.optLabels = labels;
    if (this.ready) this.redraw();
  }

  /**
   * Values the user logged (a ScalarSeries: rank, step, name, value columns), added to
   * those shown; the panel of logged values is redrawn (they come rarely).
   */
  addScalars(sc) {
    const n = sc && sc.name ? sc.name.length : 0;
    if (!n) return;
    const multiRank = new Set(sc.rank).size > 1;
    for (let i = 0; i < n; i++) {
      const name = multiRank || sc.rank[i] ? `${sc.name[i]} (rank ${sc.rank[i]})` : sc.name[i];
      let t = this.scalars.get(name);
      if (!t) this.scalars.set(name, (t = new Map()));
      t.set(sc.step[i], sc.value[i]); // a value logged again for a step replaces it
    }
    if (this.ready) this.redraw();
  }

  scalarTraces() {
    const axis = axisId(panelIndex("scalars"));
    const out = [];
    let k = 0;
    for (const [name, byStep] of this.scalars) {
      const steps = [...byStep.keys()].sort((a, b) => a - b);
      out.push({
        type: "scatter", mode: "lines+markers", xaxis: "x", yaxis: axis, name: plotText(name),
        x: steps.map((st) => this.xaxis.ofStep(st)), y: steps.map((st) => plottable(byStep.get(st))),
        meta: { scalar: name }, marker: { size: 4 },
        line: { color: PALETTE[(k++ + 3) % PALETTE.length], width: 1.4 },
        hovertemplate: `${plotText(name)} %{y:.4g}<extra></extra>`,
      });
    }
    return out;
  }

  /** A series' colour: the next of the palette when first seen, then always the same (a
   * re-fetch lists series in another order). */
  colorOf(key) {
    if (!this.colors.has(key)) this.colors.set(key, PALETTE[this.colors.size % PALETTE.length]);
    return this.colors.get(key);
  }

  /** Draw a fresh picture of `series` (Map key -> Series) for the window `range`. */
  async load(series, range = null) {
    if (!this.ready && !window.Plotly && !this.preview) {
      // plotly.js is not running yet: show the data now, interactive shortly. Plotly is
      // started once the preview has been painted (two frames later).
      this.preview = drawPreview(this.gd, series, this.findingList,
        [...series.keys()].map((k) => this.colorOf(k)));
      performance.mark("gradwatch:first-chart");
      requestAnimationFrame(() => requestAnimationFrame(() => loadPlotly()));
    } else {
      loadPlotly();
    }
    await whenPlotly();
    this.series = series;
    this.order = [...series.keys()];
    this.rows = usedRows(series.values());
    const first = !this.ready;
    if (first && this.preview) this.preview.remove();
    await this.draw(range);
    if (first) {
      // Navigation-to-chart marks, read by bench/dashboard.py and visible in devtools.
      if (!this.preview) performance.mark("gradwatch:first-chart");
      performance.mark("gradwatch:plotly-chart");
      this.preview = null;
    }
  }

  buildLayout(range) {
    const layout = chartLayout({ logScale: this.logScale, range, shapes: [], rows: this.rows,
      height: this.gd.clientHeight, shown: this.shown, optName: this.optName });
    this.bands = findingShapes(this.findingList, layout, this.activeKey, this.keyOf);
    this.xaxis.style(layout);
    layout.shapes = this.xShapes();
    this.lastLayout = layout;
    return layout;
  }

  afterDraw() {
    this.renderLegend();
  }

  labelText(s) {
    const multiRank = new Set([...this.series.values()].map((x) => x.rank)).size > 1;
    const name = this.optLabels.get(s.opt) || s.opt;
    return multiRank ? `rank ${s.rank} ${name}` : name;
  }

  seriesTraces(s) {
    const color = this.colorOf(s.key);
    const name = plotText(this.labelText(s));
    const xs = this.xaxis.isStep ? null : this.xaxis.rowsX(s);
    const traces = panelTraces(s, (spec) => ({
      name: `${name} ${spec.label}`, legendgroup: s.key,
      meta: { opt: s.opt, rank: s.rank, field: spec.field },
      line: { color, width: spec.width, dash: spec.dash || "solid" },
      opacity: spec.opacity || 1, hovertemplate: `${spec.hover}<extra>%{fullData.name}</extra>`,
    }), null, this.shown, this.smoothing);
    if (xs) for (const t of traces) t.x = xs.slice();
    return traces;
  }

  /** Row positions on the strip. */
  rowPos() {
    return new Map(this.rows.map((key, k) => [key, k]));
  }

  buildTraces() {
    // Which panels are drawn is settled here, before the traces: draw() builds the traces
    // first, and a trace of a panel not yet known to be shown is made invisible (a stored
    // run opened cold drew its loss and lr panels empty).
    this.shown = shownPanels(this.series.values(), this.scalars.size);
    this.xaxis = new XAxis(this.xmode, this.series.values());
    const pts = emptyPoints();
    const pos = this.rowPos();
    for (const s of this.series.values()) this.events(s, 0, s.length, pts, pos);
    const strip = axisId(PANELS.length);
    const out = [
      ...EVENT_ROWS.map(([key, name, color, hover], k) => ({
        type: "scatter", mode: "lines", name, x: pts[k].x, y: pts[k].y, xaxis: "x",
        yaxis: strip, line: { color, width: 1 }, fill: "toself", fillcolor: color,
        connectgaps: false, showlegend: false, hoveron: "points",
        meta: { event: key }, hovertemplate: `${hover}<extra></extra>`,
      })),
      {
        type: "scatter", mode: "lines", name: "stale steps", x: pts[STALE_OVERLAY].x,
        y: pts[STALE_OVERLAY].y, xaxis: "x", yaxis: axisId(PANELS.findIndex((p) => p.key === "drift")),
        connectgaps: false, line: { color: "#f26d6d", width: 3 }, meta: { field: "stale" },
        hovertemplate: "stale step · drift %{y:.3f}<extra></extra>",
      },
    ];
    for (const key of this.order) out.push(...this.seriesTraces(this.series.get(key)));
    out.push(...this.scalarTraces()); // after every series' traces: their indices stay put
    return out;
  }

  /** New rows were appended to these series (from series.ingest); draw them next frame. */
  append(added, created) {
    if (created.length) {
      // A new optimizer or rank mid-run: rare, so redraw with its traces.
      for (const s of created) if (!this.order.includes(s.key)) this.order.push(s.key);
      this.pending.clear();
      this.redraw();
      return;
    }
    for (const [key, { from }] of added) super.append(key, from);
  }

  collect(batch) {
    const pts = emptyPoints();
    const pos = this.rowPos();
    let tooBig = false;
    for (const [key, from] of this.pending) {
      const at = this.order.indexOf(key);
      const s = this.series.get(key);
      if (at < 0 || !s || from >= s.length) continue;
      const x = this.xaxis.rowsX(s, from);
      let i = N_FIXED + at * PER_SERIES;
      let appears = false; // a value for a panel not shown yet (the first loss of a run)
      PANELS.forEach((panel, p) => {
        for (const spec of panel.traces) {
          const ys = traceValues(s, spec, this.smoothing, from);
          if (!this.shown[p] && ys.some((v) => v !== null)) appears = true;
          batch.xs.push(x);
          batch.ys.push(ys);
          batch.idx.push(i++);
        }
      });
      if (appears) return true;
      this.events(s, from, s.length, pts, pos);
      if (s.length > LIVE_CAP) tooBig = true;
    }
    if (pts.missing.size) {
      // A kind of event the strip has no row for yet: add it and redraw once.
      const rows = new Set([...this.rows, ...pts.missing]);
      this.rows = EVENT_ROWS.map(([k]) => k).filter((k) => rows.has(k));
      return true;
    }
    if (tooBig) {
      // Re-downsample everything and redraw once, instead of letting traces grow forever.
      for (const s of this.series.values()) compact(s, LIVE_CAP / 2);
      return true;
    }
    pts.forEach((p, k) => {
      if (p.x.length) {
        batch.xs.push(p.x);
        batch.ys.push(p.y);
        batch.idx.push(k);
      }
    });
    return false;
  }

  renderLegend() {
    if (this.legend) renderLegend(this.legend, this, PER_SERIES);
  }

  /**
   * Band each finding's steps; `activeKey` (by `keyOf`) is outlined. Redrawn at most once
   * a second: findings of a live run change with almost every batch while a bug goes on.
   */
  setFindings(findings, activeKey = this.activeKey, keyOf = this.keyOf) {
    this.findingList = findings;
    this.activeKey = activeKey;
    this.keyOf = keyOf;
    const bands = findingShapes(findings, this.lastLayout, activeKey, keyOf);
    if (JSON.stringify(bands) === JSON.stringify(this.bands)) return;
    this.bands = bands;
    this.renderLegend();
    if (this.shapesTimer) return;
    const wait = Math.max(0, this.shapesAt + SHAPES_GAP_MS - performance.now());
    this.shapesTimer = setTimeout(() => {
      this.shapesTimer = 0;
      this.shapesAt = performance.now();
      this.redrawShapes();
    }, wait);
  }

  async setCursor(step) {
    this.cursor = step;
    await this.redrawShapes();
  }

  async redrawShapes() {
    if (!this.ready) return;
    await this.ready;
    await window.Plotly.relayout(this.gd, { shapes: this.xShapes() });
  }

  destroy() {
    clearTimeout(this.shapesTimer);
    super.destroy();
  }
}
