/**
 * The compare figure: the compare traces of panels.js (‖grad‖, drift, and the loss where
 * some run recorded one) of several runs overlaid on one step axis, a colour per run and a dash per optimizer within a run, with
 * an HTML legend naming each run.
 */

import { LiveFigure } from "./figure.js";
import { el, plotText } from "./format.js";
import { compareLayout, driftOneLine } from "./layout.js";
import { lineItem } from "./legend.js";
import { PANELS, panelTraces, shownPanels } from "./panels.js";
import { compact } from "./series.js";

const COMPARED = PANELS.flatMap((p) => p.traces.filter((t) => t.compare));
const PER_SERIES = COMPARED.length;
const DASHES = ["solid", "dash", "dot", "dashdot"];
/** Rows per series above which live data is compacted (to half of it). */
const LIVE_CAP = 4000;

export const RUN_COLORS = ["#5aa9ff", "#f2b84b", "#3fcf8e", "#ff7b9c", "#b58cff", "#4dd4e0",
  "#d4d45a", "#ff9b5a"];

const sep = "\u0001";

export class CompareChart extends LiveFigure {
  /**
   * @param {HTMLElement} gd the graph div
   * @param {{onRange: (range: number[]|null) => void}} hooks
   * @param {HTMLElement} legend the box of the HTML legend
   */
  constructor(gd, hooks, legend) {
    super(gd, hooks);
    this.legend = legend;
    this.runs = new Map(); // run id -> {name, series: Map, color}
    this.order = []; // [run id, series key] in trace order
  }

  /** Show a run's series under its name (replacing what was shown for it). */
  setRun(runId, name, series, color) {
    this.runs.set(runId, { name, series, color });
    this.order = [];
    for (const [id, run] of this.runs) {
      for (const key of run.series.keys()) this.order.push([id, key]);
    }
  }

  /** A label for a series: the run's name, and its optimizer when the run has several. */
  label(runId, s) {
    const run = this.runs.get(runId);
    return run.series.size > 1 ? `${run.name} · ${s.rank ? `rank ${s.rank} ` : ""}${s.opt}` : run.name;
  }

  /** Per panel, whether the compare chart shows it: a compared panel, and an optional one
   * (the loss) only where some run's series has a value for it. */
  shown() {
    const all = [...this.runs.values()].flatMap((run) => [...run.series.values()]);
    const has = shownPanels(all);
    return PANELS.map((p, i) => p.traces.some((t) => t.compare) && has[i]);
  }

  buildTraces() {
    const out = [];
    const shown = this.shown();
    this.shownKey = shown.join();
    const optIndex = new Map();
    for (const [runId, key] of this.order) {
      const run = this.runs.get(runId);
      const s = run.series.get(key);
      const k = optIndex.get(runId) || 0;
      optIndex.set(runId, k + 1);
      const name = plotText(this.label(runId, s));
      out.push(...panelTraces(s, (spec) => ({
        name: `${name} ${spec.label}`, legendgroup: runId,
        meta: { run: runId, opt: s.opt, rank: s.rank, field: spec.field },
        line: { color: run.color, width: spec.width, dash: DASHES[k % DASHES.length] },
        hovertemplate: `${spec.hover}<extra>${name}</extra>`,
      }), (spec) => spec.compare, shown));
    }
    return out;
  }

  buildLayout(range) {
    return compareLayout({ logScale: this.logScale, range, shapes: [driftOneLine()],
      shown: this.shown(), height: this.gd.clientHeight });
  }

  afterDraw() {
    const items = this.order.map(([runId, key], pos) => {
      const s = this.runs.get(runId).series.get(key);
      const traces = Array.from({ length: PER_SERIES }, (_, j) => pos * PER_SERIES + j);
      const k = this.order.slice(0, pos).filter(([id]) => id === runId).length;
      return lineItem(this, this.label(runId, s), this.runs.get(runId).color,
        ["solid", "dashed", "dotted", "dashed"][k % 4], traces,
        "‖grad‖, drift and loss (top to bottom) of this run");
    });
    const loss = this.shown()[PANELS.findIndex((p) => p.key === "loss")];
    items.push(el("span", { class: "lg muted" },
      `top: ‖grad‖ · ${loss ? "middle" : "bottom"}: drift (dashed: drift = 1)` +
      (loss ? " · bottom: loss" : "")));
    this.legend.replaceChildren(...items);
  }

  /** Rows were appended to a run's series (series.ingest's result). */
  appendRun(runId, added, created) {
    if (created.length || this.shown().join() !== this.shownKey) { // a new series, or a loss
      const run = this.runs.get(runId);
      if (run) this.setRun(runId, run.name, run.series, run.color);
      this.redraw();
      return;
    }
    for (const [key, { from }] of added) this.append(`${runId}${sep}${key}`, from);
  }

  collect(batch) {
    let tooBig = false;
    for (const [pkey, from] of this.pending) {
      const [runId, key] = pkey.split(sep);
      const at = this.order.findIndex(([r, k]) => r === runId && k === key);
      const run = this.runs.get(runId);
      const s = run && run.series.get(key);
      if (at < 0 || !s || from >= s.length) continue;
      const x = s.step.slice(from);
      COMPARED.forEach((spec, j) => {
        batch.xs.push(x);
        batch.ys.push(s[spec.column].slice(from));
        batch.idx.push(at * PER_SERIES + j);
      });
      if (s.length > LIVE_CAP) tooBig = true;
    }
    if (tooBig) {
      for (const run of this.runs.values()) for (const s of run.series.values()) compact(s, LIVE_CAP / 2);
    }
    return tooBig;
  }
}
