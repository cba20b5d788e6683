/**
 * The run's main figure: gradient norm (accumulated and fresh), drift with its 1.0 line,
 * and a strip of reset events, on one shared step axis so zoom and pan move all three.
 *
 * `Plotly.newPlot` runs once per run view; later data arrives through
 * `Plotly.extendTraces`, batched into one call per animation frame. `Plotly.react` is used
 * only when the whole picture changes (snapshot, zoom re-fetch, compaction).
 */

import { EVENT_ROWS, eventPoints, N_FIXED, STALE_OVERLAY } from "./events.js";
import { applyRange, chartConfig, chartLayout, chartShapes, findingShapes } from "./layout.js";
import { renderLegend } from "./legend.js";
import { loadPlotly, whenPlotly } from "./loadplotly.js";
import { drawPreview } from "./preview.js";
import { compact } from "./series.js";
import { plotText } from "./format.js";

/** Rows per series above which live data is compacted (to half of it). */
const LIVE_CAP = 4000;
/** Live redraws are spaced by this many times their own cost, and never more than... */
const REDRAW_SPACING = 6;
/** ...this many ms apart. */
const MAX_REDRAW_GAP_MS = 1000;
/** Least time between two redraws of the finding shading. */
const SHAPES_GAP_MS = 1000;

const PALETTE = ["#5aa9ff", "#f2b84b", "#3fcf8e", "#ff7b9c", "#b58cff", "#4dd4e0", "#d4d45a", "#ff9b5a"];


export class MainChart {
  /**
   * @param {HTMLElement} gd the graph div
   * @param {{onRange: (range: number[]|null, byUser: boolean) => void}} hooks
   */
  constructor(gd, hooks, legend = null) {
    this.gd = gd;
    this.legend = legend;
    this.hooks = hooks;
    this.series = new Map();
    this.order = []; // series keys in trace order
    this.pending = new Map(); // key -> first new row index, flushed per animation frame
    this.frame = 0;
    this.timer = 0;
    this.nextAt = 0;
    this.paused = false;
    this.follow = true;
    this.logScale = false;
    this.findingShapes = [];
    this.findingList = [];
    this.hidden = new Set(); // trace indices the user switched off in the legend
    this.shapesTimer = 0;
    this.shapesAt = 0;
    this.preview = null;
    this.cursor = null;
    this.ready = null;
  }

  /** Draw a fresh picture of `series` (Map key -> Series). */
  async load(series, range = null) {
    if (!this.ready && !window.Plotly && !this.preview) {
      // plotly.js is not running yet: show the data now, interactive shortly. Plotly is
      // started once the preview has been painted (two frames later).
      this.preview = drawPreview(this.gd, series, this.findingList, PALETTE);
      performance.mark("gradwatch:first-chart");
      requestAnimationFrame(() => requestAnimationFrame(() => loadPlotly()));
    } else {
      loadPlotly();
    }
    const Plotly = await whenPlotly();
    this.series = series;
    this.order = [...series.keys()];
    this.pending.clear();
    const data = this.buildTraces();
    if (!this.ready) {
      if (this.preview) this.preview.remove();
      this.ready = Plotly.newPlot(this.gd, data, this.buildLayout(range), this.config());
      await this.ready;
      // Navigation-to-chart marks, read by bench/dashboard.py and visible in devtools.
      if (!this.preview) performance.mark("gradwatch:first-chart");
      performance.mark("gradwatch:plotly-chart");
      this.preview = null;
      this.gd.on("plotly_relayout", (ev) => this.onRelayout(ev));
    } else {
      await this.ready;
      const layout = this.gd.layout;
      this.applyRange(layout, range);
      layout.shapes = this.shapes();
      layout.datarevision = (layout.datarevision || 0) + 1;
      await Plotly.react(this.gd, data, layout, this.config());
    }
    this.renderLegend();
  }

  config() {
    return chartConfig();
  }

  applyRange(layout, range) {
    applyRange(layout, range);
  }

  buildLayout(range) {
    return chartLayout(this.logScale, range, this.shapes());
  }

  shapes() {
    return chartShapes(this.findingShapes, this.cursor);
  }

  labelText(s) {
    const multiRank = new Set([...this.series.values()].map((x) => x.rank)).size > 1;
    return multiRank ? `rank ${s.rank} ${s.opt}` : s.opt;
  }

  label(s) {
    return plotText(this.labelText(s));
  }

  seriesTraces(s, idx) {
    const color = PALETTE[idx % PALETTE.length];
    const name = this.label(s);
    const common = { type: "scatter", mode: "lines", xaxis: "x", legendgroup: s.key };
    return [
      { ...common, name: `${name} ‖grad‖`, x: s.step.slice(), y: s.norm.slice(), yaxis: "y",
        meta: { opt: s.opt, rank: s.rank, field: "norm" },
        line: { color, width: 1.6 }, legendrank: 100 + idx,
        hovertemplate: "‖grad‖ %{y:.4g}<extra>%{fullData.name}</extra>" },
      { ...common, name: `${name} fresh`, x: s.step.slice(), y: s.fresh.slice(), yaxis: "y",
        meta: { opt: s.opt, rank: s.rank, field: "fresh_norm" },
        line: { color, width: 1.2, dash: "dot" }, opacity: 0.75, legendrank: 101 + idx,
        hovertemplate: "fresh %{y:.4g}<extra>%{fullData.name}</extra>" },
      { ...common, name: `${name} drift`, x: s.step.slice(), y: s.drift.slice(), yaxis: "y2",
        meta: { opt: s.opt, rank: s.rank, field: "drift" },
        line: { color, width: 1.6 }, legendrank: 102 + idx, showlegend: false,
        hovertemplate: "drift %{y:.3f}<extra>%{fullData.name}</extra>" },
    ];
  }

  emptyMarkers() {
    return Array.from({ length: N_FIXED }, () => ({ x: [], y: [] }));
  }

  buildTraces() {
    const pts = this.emptyMarkers();
    for (const s of this.series.values()) eventPoints(s, 0, s.length, pts);
    const fixed = [
      ...EVENT_ROWS.map(([key, name, color, hover], k) => ({
        type: "scatter", mode: "lines", name, x: pts[k].x, y: pts[k].y, xaxis: "x",
        yaxis: "y3", line: { color, width: 1 }, fill: "toself", fillcolor: color,
        connectgaps: false, showlegend: false, hoveron: "points",
        meta: { field: `event:${key}` }, hovertemplate: `${hover}<extra></extra>`,
      })),
      {
        type: "scatter", mode: "lines", name: "stale steps", x: pts[STALE_OVERLAY].x,
        y: pts[STALE_OVERLAY].y, xaxis: "x", yaxis: "y2", connectgaps: false,
        line: { color: "#f26d6d", width: 3 }, legendrank: 200, meta: { field: "stale" },
        hovertemplate: "stale step · drift %{y:.3f}<extra></extra>",
      },
    ];
    const out = fixed;
    this.order.forEach((key, idx) => out.push(...this.seriesTraces(this.series.get(key), idx)));
    for (const i of this.hidden) if (out[i]) out[i].visible = false;
    return out;
  }

  /** New rows were appended to these series (from series.ingest); draw them next frame. */
  append(added, created) {
    if (created.length) {
      // A new optimizer or rank mid-run: rare, so add its traces straight away.
      this.addSeriesTraces(created);
    }
    for (const [key, { from }] of added) {
      if (!this.pending.has(key)) this.pending.set(key, from);
    }
    this.schedule();
  }

  async addSeriesTraces(created) {
    const Plotly = await whenPlotly();
    await this.ready;
    const traces = [];
    for (const s of created) {
      if (this.order.includes(s.key)) continue;
      this.order.push(s.key);
      traces.push(...this.seriesTraces(s, this.order.length - 1).map((t) => ({ ...t, x: [], y: [] })));
      // its rows are drawn by the next flush, from index 0
      this.pending.set(s.key, 0);
    }
    if (traces.length) await Plotly.addTraces(this.gd, traces);
    this.renderLegend();
  }

  renderLegend() {
    if (this.legend) renderLegend(this.legend, this, PALETTE);
  }

  /**
   * Draw pending rows on the next animation frame, but no sooner than the last redraw's
   * cost allows: plotly redraws the whole figure on extendTraces, so live redraws are
   * spaced to take at most about a sixth of the main thread and hover, zoom and scroll
   * stay smooth however fast steps arrive.
   */
  schedule() {
    if (this.frame || this.timer || this.paused || !this.ready) return;
    const wait = this.nextAt - performance.now();
    if (wait > 0) {
      this.timer = setTimeout(() => {
        this.timer = 0;
        this.schedule();
      }, wait);
      return;
    }
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      const t = performance.now();
      this.flush();
      const cost = performance.now() - t;
      this.nextAt = performance.now() + Math.min(MAX_REDRAW_GAP_MS, cost * REDRAW_SPACING);
    });
  }

  /** One extendTraces call for everything that arrived since the last frame. */
  flush() {
    if (this.paused || !this.pending.size) return;
    const Plotly = window.Plotly;
    const xs = [], ys = [], idx = [];
    const pts = this.emptyMarkers();
    let tooBig = false;
    for (const [key, from] of this.pending) {
      const pos = this.order.indexOf(key);
      const s = this.series.get(key);
      if (pos < 0 || !s || from >= s.length) continue;
      const base = N_FIXED + pos * 3;
      const x = s.step.slice(from);
      xs.push(x, x, x);
      ys.push(s.norm.slice(from), s.fresh.slice(from), s.drift.slice(from));
      idx.push(base, base + 1, base + 2);
      eventPoints(s, from, s.length, pts);
      if (s.length > LIVE_CAP) tooBig = true;
    }
    this.pending.clear();
    pts.forEach((p, k) => {
      if (p.x.length) {
        xs.push(p.x);
        ys.push(p.y);
        idx.push(k);
      }
    });
    if (tooBig) {
      // Re-downsample everything and redraw once, instead of letting traces grow forever.
      for (const s of this.series.values()) compact(s, LIVE_CAP / 2);
      this.load(this.series, this.follow ? null : this.currentRange());
      return;
    }
    if (idx.length) {
      Plotly.extendTraces(this.gd, { x: xs, y: ys }, idx);
    }
  }

  setPaused(paused) {
    this.paused = paused;
    if (!paused) this.schedule();
  }

  async setLogScale(on) {
    this.logScale = on;
    const Plotly = await whenPlotly();
    await this.ready;
    await Plotly.relayout(this.gd, {
      "yaxis.type": on ? "log" : "linear", "yaxis.autorange": true,
      "yaxis2.type": on ? "log" : "linear", "yaxis2.autorange": true,
      "yaxis2.rangemode": on ? "normal" : "tozero",
    });
  }

  /** Zoom the step axis (fires the same path as a user zoom: follow off, re-fetch). */
  async zoomTo(a, b) {
    const Plotly = await whenPlotly();
    await this.ready;
    await Plotly.relayout(this.gd, { "xaxis.range": [a, b], "xaxis.autorange": false });
  }

  currentRange() {
    const ax = this.gd.layout && this.gd.layout.xaxis;
    if (!ax || ax.autorange || !ax.range) return null;
    return [Number(ax.range[0]), Number(ax.range[1])];
  }

  /**
   * A relayout that moved the step axis: a user zoom, pan or double-click, or zoomTo().
   * Our own relayouts (shapes, log scale) and resizes ({autosize: true}) carry no x-axis
   * keys, react() and extendTraces() emit none, so no bookkeeping is needed to tell them
   * apart.
   */
  onRelayout(ev) {
    if (ev["xaxis.autorange"] === true) {
      this.hooks.onRange(null, true);
    } else if ("xaxis.range[0]" in ev || "xaxis.range" in ev) {
      const r = ev["xaxis.range"] || [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
      this.hooks.onRange([Number(r[0]), Number(r[1])], true);
    }
  }

  /** Shade each finding's steps. Redrawn at most once a second: findings of a live run
   * change with almost every batch while a bug goes on. */
  setFindings(findings) {
    this.findingList = findings;
    const shapes = findingShapes(findings);
    if (JSON.stringify(shapes) === JSON.stringify(this.findingShapes)) return;
    this.findingShapes = shapes;
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
    const Plotly = await whenPlotly();
    await this.ready;
    await Plotly.relayout(this.gd, { shapes: this.shapes() });
  }

  async downloadPng(filename) {
    const Plotly = await whenPlotly();
    await this.ready;
    return Plotly.downloadImage(this.gd, { format: "png", filename, width: 1400, height: 700 });
  }

  /** Release the figure (leaving the run view). */
  destroy() {
    if (this.frame) cancelAnimationFrame(this.frame);
    clearTimeout(this.timer);
    clearTimeout(this.shapesTimer);
    if (window.Plotly && this.ready) window.Plotly.purge(this.gd);
    this.ready = null;
  }
}

