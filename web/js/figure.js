/**
 * A plotly figure on a step axis that grows live: the part the run chart and the compare
 * chart share.
 *
 * `Plotly.newPlot` runs once per figure; later rows arrive through `Plotly.extendTraces`,
 * batched into one call per animation frame. `Plotly.react` is used only when the whole
 * picture changes (snapshot, zoom re-fetch, compaction, a new strip row). Zoomed in, the y
 * axes are fitted to the points inside the step window (panels.fitY), also as rows arrive.
 *
 * Subclasses provide `buildTraces()`, `buildLayout(range)`, `collect(batch)` (the new
 * points of `this.pending`; returns true when only a full redraw will do) and may override
 * `afterDraw()` and `redraw()`.
 */

import { chartConfig } from "./layout.js";
import { whenPlotly } from "./loadplotly.js";
import { applyFit, fitUpdate, fitY } from "./panels.js";

/** Live redraws are spaced by this many times their own cost, and never more than... */
const REDRAW_SPACING = 6;
/** ...this many ms apart. */
const MAX_REDRAW_GAP_MS = 1000;

export class LiveFigure {
  /**
   * @param {HTMLElement} gd the graph div
   * @param {{onRange: (range: number[]|null, byUser: boolean) => void}} hooks
   */
  constructor(gd, hooks) {
    this.gd = gd;
    this.hooks = hooks;
    this.pending = new Map(); // key -> first new row index, flushed per animation frame
    this.frame = 0;
    this.timer = 0;
    this.nextAt = 0;
    this.paused = false;
    this.logScale = false;
    this.range = null; // the step window shown; null: the whole run
    this.hidden = new Set(); // trace indices the user switched off in the legend
    this.ready = null;
    this.revision = 0;
    this.stale = false; // a redraw waits for the figure to be unfrozen
  }

  /** Draw the whole picture for the step window `range` (null: the whole run). */
  async draw(range = null) {
    const Plotly = await whenPlotly();
    this.range = range;
    this.pending.clear();
    this.stale = false;
    const data = this.buildTraces();
    for (const i of this.hidden) if (data[i]) data[i].visible = false;
    const layout = this.buildLayout(range);
    applyFit(layout, fitY(data, this.toX(range), this.logScale));
    if (!this.ready) {
      this.ready = Plotly.newPlot(this.gd, data, layout, chartConfig());
      await this.ready;
      this.gd.on("plotly_relayout", (ev) => this.onRelayout(ev));
      this.watchHeight();
    } else {
      await this.ready;
      layout.datarevision = ++this.revision;
      await Plotly.react(this.gd, data, layout, chartConfig());
    }
    this.afterDraw();
  }

  afterDraw() {}

  /** A step window as x-axis values (a subclass whose x axis is not steps maps it). */
  toX(range) {
    return range;
  }

  /** An x-axis window (from a relayout event) as steps. */
  fromX(range) {
    return range && range.map(Number);
  }

  /** Redraw when the graph div's height changes (a resized window): how many tick labels a
   * panel has room for is set from its height in pixels (layout.js). */
  watchHeight() {
    let height = this.gd.clientHeight;
    this.resized = new ResizeObserver(() => {
      const h = this.gd.clientHeight;
      if (!h || Math.abs(h - height) < 8) return;
      height = h;
      clearTimeout(this.resizeTimer);
      this.resizeTimer = setTimeout(() => { if (this.ready) this.redraw(); }, 150);
    });
    this.resized.observe(this.gd);
  }

  /** Redraw everything (new traces, rows or compacted data) keeping the window; while
   * frozen, once unfrozen. */
  redraw() {
    if (this.paused) {
      this.stale = true;
      return Promise.resolve();
    }
    return this.draw(this.range);
  }

  /** Rows from index `from` on were appended to the data under `key`: draw them soon. */
  append(key, from) {
    if (!this.pending.has(key)) this.pending.set(key, from);
    this.schedule();
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
    const batch = { xs: [], ys: [], idx: [] };
    const redraw = this.collect(batch);
    this.pending.clear();
    if (redraw) {
      this.redraw();
      return;
    }
    if (batch.idx.length) {
      window.Plotly.extendTraces(this.gd, { x: batch.xs, y: batch.ys }, batch.idx);
      if (this.range) this.refit();
    }
  }

  /** Fit the y axes to the points in the window (only relayouts when a range changed). */
  async refit() {
    if (!this.ready) return;
    await this.ready;
    const update = fitUpdate(this.gd.layout,
      fitY(this.gd.data, this.toX(this.range), this.logScale));
    if (update) await window.Plotly.relayout(this.gd, update);
  }

  setPaused(paused) {
    this.paused = paused;
    if (paused) return;
    if (this.stale) this.draw(this.range);
    else this.schedule();
  }

  async setLogScale(on) {
    this.logScale = on;
    const Plotly = await whenPlotly();
    if (!this.ready) return;
    await this.ready;
    const update = {};
    for (const key of Object.keys(this.gd.layout).filter((k) => /^yaxis\d*$/.test(k))) {
      if (this.gd.layout[key].tickmode === "array") continue; // the event strip
      if (!this.gd._fullLayout[key]) continue; // an axis no trace refers to
      update[`${key}.type`] = on ? "log" : "linear";
      update[`${key}.autorange`] = true;
    }
    await Plotly.relayout(this.gd, update);
    await this.refit();
  }

  /** Zoom the step axis (fires the same path as a user zoom: follow off, re-fetch). */
  async zoomTo(a, b) {
    const Plotly = await whenPlotly();
    await this.ready;
    await Plotly.relayout(this.gd, { "xaxis.range": this.toX([a, b]), "xaxis.autorange": false });
  }

  /** Show the whole run (fires the same path as a double-click). */
  async zoomOut() {
    const Plotly = await whenPlotly();
    await this.ready;
    await Plotly.relayout(this.gd, { "xaxis.autorange": true });
  }

  /** The steps plotted, first to last, over every trace (null when empty). */
  extent() {
    let lo = Infinity, hi = -Infinity;
    for (const t of this.gd.data || []) {
      if (!t.meta || !t.meta.field || !t.x.length) continue;
      lo = Math.min(lo, t.x[0]);
      hi = Math.max(hi, t.x[t.x.length - 1]);
    }
    return lo <= hi ? this.fromX([lo, hi]) : null;
  }

  /**
   * A relayout that moved the step axis: a user zoom, pan or double-click, or zoomTo().
   * Our own relayouts (shapes, y ranges, log scale) and resizes carry no x-axis keys,
   * react() and extendTraces() emit none, so no bookkeeping is needed to tell them apart.
   */
  onRelayout(ev) {
    let range;
    if (ev["xaxis.autorange"] === true) {
      range = null;
    } else if ("xaxis.range[0]" in ev || "xaxis.range" in ev) {
      const r = ev["xaxis.range"] || [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
      range = this.fromX([r[0], r[1]]);
    } else {
      return;
    }
    this.range = range;
    this.refit();
    this.hooks.onRange(range, true);
  }

  /** Show or hide traces (from the legend). */
  setVisible(traces, on) {
    for (const t of traces) {
      if (on) this.hidden.delete(t);
      else this.hidden.add(t);
    }
    window.Plotly.restyle(this.gd, { visible: on }, traces).then(() => this.refit());
  }

  /** Release the figure (leaving the view). */
  destroy() {
    if (this.frame) cancelAnimationFrame(this.frame);
    clearTimeout(this.timer);
    clearTimeout(this.resizeTimer);
    if (this.resized) this.resized.disconnect();
    if (window.Plotly && this.ready) window.Plotly.purge(this.gd);
    this.ready = null;
  }
}
