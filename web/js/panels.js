/**
 * The panels on the charts' shared step axis, top to bottom, and the traces each draws from
 * a Series column. The run chart, the compare chart, the canvas preview and the y-axis
 * fitting all read this list: another quantity per step is one more entry here plus its
 * column in series.js (VALUE_COLUMNS). An `optional` panel is shown only when the run has a
 * value for it (shownPanels): the loss and learning rate of a run recorded before the probe
 * read them, or the values a user logged (handle.log), which the `scalars` panel draws as a
 * trace per name.
 */

import { ema } from "./smoothing.js";

/**
 * @typedef {object} TraceSpec
 * @property {string} field   meta.field of the plotted trace (tests and benches read it)
 * @property {string} column  the Series column it plots
 * @property {string} label   its name in legends and hover
 * @property {string} help    what it is, for the legend's tooltip
 * @property {boolean} compare drawn for each run on the compare chart too
 * @property {boolean} [smooth] the EMA (smoothing.js) of its column, drawn only while the
 *   smoothing slider is above 0; the raw trace of that column is then drawn faint
 */
export const PANELS = [
  {
    key: "norm", title: "‖grad‖", weight: 1.15, tozero: false,
    traces: [
      { field: "norm", column: "norm", label: "‖grad‖", width: 1.6, compare: true,
        hover: "‖grad‖ %{y:.4g}",
        help: "Norm of the accumulated gradient each optimizer step read" },
      { field: "fresh_norm", column: "fresh", label: "fresh", width: 1.2, dash: "dot",
        opacity: 0.75, compare: false, hover: "fresh %{y:.4g}",
        help: "Norm of what backward() added since the previous step" },
      { field: "norm_smooth", column: "norm", smooth: true, label: "‖grad‖ smoothed",
        width: 1.8, compare: false, hover: "‖grad‖ smoothed %{y:.4g}",
        help: "‖grad‖ smoothed (the smoothing slider), the raw line faint behind" },
    ],
  },
  {
    key: "drift", title: "drift", weight: 0.65, tozero: true,
    traces: [
      { field: "drift", column: "drift", label: "drift", width: 1.6, compare: true,
        hover: "drift %{y:.3f}",
        help: "‖grad‖ / fresh: 1.0 when every gradient was reset; climbs on a missed reset" },
    ],
  },
  {
    key: "loss", title: "loss", weight: 0.6, tozero: false, optional: true,
    traces: [
      { field: "loss", column: "loss", label: "loss", width: 1.4, compare: true,
        hover: "loss %{y:.4g}",
        help: "Sum of the losses passed to backward() for this step, as passed (divided by " +
          "the accumulation count if the loop divides; before GradScaler's scaling)" },
      { field: "loss_smooth", column: "loss", smooth: true, label: "loss smoothed", width: 1.6,
        compare: false, hover: "loss smoothed %{y:.4g}",
        help: "The loss smoothed (the smoothing slider), the raw line faint behind" },
    ],
  },
  {
    key: "lr", title: "lr", weight: 0.4, tozero: true, optional: true,
    traces: [
      { field: "lr", column: "lr", label: "lr", width: 1.2, compare: false,
        hover: "lr %{y:.3g}", help: "Learning rate of the optimizer's first param group" },
    ],
  },
  { key: "scalars", title: "logged", weight: 0.6, tozero: false, optional: true, traces: [] },
];

/**
 * Which panels a figure shows (a boolean per PANELS entry): every panel that is not
 * optional, and an optional one when some series has a value in one of its columns (the
 * scalars panel: when `scalarNames` > 0).
 */
export function shownPanels(series, scalarNames = 0) {
  const list = [...series];
  return PANELS.map((p) => {
    if (!p.optional) return true;
    if (p.key === "scalars") return scalarNames > 0;
    return p.traces.some((t) => list.some((s) => s[t.column].some((v) => v !== null)));
  });
}

/** Gap between panels, as a fraction of the plot height. */
const GAP = 0.04;

/** Index of the panel with this key (-1 if none). */
export function panelIndex(key) {
  return PANELS.findIndex((p) => p.key === key);
}

/** The y axis a trace of panel i refers to: "y", "y2", ... */
export function axisId(i) {
  return i === 0 ? "y" : `y${i + 1}`;
}

/** The layout key of panel i's y axis: "yaxis", "yaxis2", ... */
export function axisKey(i) {
  return i === 0 ? "yaxis" : `yaxis${i + 1}`;
}

/**
 * Vertical domains [bottom, top] of each panel, sharing what a strip of height `below`
 * (a fraction of the plot, 0 for none) leaves, by weight, among the panels `shown` (a
 * boolean per panel, from shownPanels; default: the panels that are not optional). A
 * panel not shown gets null.
 */
export function panelDomains(below = 0, shown = null) {
  const on = shown || PANELS.map((p) => !p.optional);
  const bottom = below > 0 ? below + GAP : 0;
  const showing = PANELS.filter((_, i) => on[i]);
  const total = showing.reduce((a, p) => a + p.weight, 0);
  const span = 1 - bottom - GAP * (showing.length - 1);
  const out = [];
  let top = 1;
  PANELS.forEach((p, i) => {
    if (!on[i]) {
      out.push(null);
      return;
    }
    const h = (span * p.weight) / total;
    out.push([Math.max(0, top - h), top]);
    top -= h + GAP;
  });
  return out;
}

/** The y values of a trace spec for rows [from, end) of series s at this smoothing weight:
 * a smooth spec's EMA (nothing while smoothing is off), else the column as it is. */
export function traceValues(s, spec, smoothing, from = 0) {
  const col = s[spec.column];
  if (!spec.smooth) return col.slice(from);
  if (!(smoothing > 0)) return new Array(col.length - from).fill(null);
  return ema(col, smoothing).slice(from);
}

/** True when this (raw) spec has a smoothed twin in its panel. */
export function hasSmoothTwin(panel, spec) {
  return !spec.smooth && panel.traces.some((t) => t.smooth && t.column === spec.column);
}

/** Opacity of a raw line while its smoothed twin is drawn over it. */
const FAINT = 0.28;

/**
 * Plotly traces of every panel for one series: `style(spec)` adds colour and names. A trace
 * of a panel not `shown` is there (trace indices stay fixed) but invisible, and so is a
 * smoothed trace while `smoothing` is 0.
 */
export function panelTraces(s, style, only = null, shown = null, smoothing = 0) {
  const out = [];
  PANELS.forEach((panel, i) => {
    for (const spec of panel.traces) {
      if (only && !only(spec)) continue;
      const trace = {
        type: "scatter", mode: "lines", xaxis: "x", yaxis: axisId(i),
        x: s.step.slice(), y: traceValues(s, spec, smoothing),
        ...style(spec, panel),
      };
      if (smoothing > 0 && hasSmoothTwin(panel, spec)) trace.opacity = FAINT;
      if ((shown && !shown[i]) || (spec.smooth && !(smoothing > 0))) trace.visible = false;
      out.push(trace);
    }
  });
  return out;
}

/**
 * Per panel axis key ("yaxis", "yaxis2", ...), the y range that fits the points of
 * `traces` inside the step window `range` ([lo, hi]), or null where plotly's autorange
 * should fit (the whole run, or no point in the window). Plotly's autorange fits every
 * point of a trace, including those outside the window: zoomed into a live run, the lines
 * would read flat against the newest steps.
 */
export function fitY(traces, range, logScale) {
  const out = new Map();
  PANELS.forEach((panel, i) => {
    const span = range ? extent(traces, axisId(i), range, logScale) : null;
    out.set(axisKey(i), span ? padded(span, logScale, panel.tozero) : null);
  });
  return out;
}

/** Write fitted ranges (from fitY) into a layout object. */
export function applyFit(layout, fits) {
  for (const [key, r] of fits) {
    if (!layout[key]) continue;
    layout[key].autorange = r === null;
    if (r === null) delete layout[key].range;
    else layout[key].range = r;
  }
}

/** The relayout update that moves a drawn figure's axes to fitted ranges (null: none). */
export function fitUpdate(layout, fits) {
  const update = {};
  for (const [key, r] of fits) {
    if (!layout[key]) continue; // a panel the figure does not draw
    const ax = layout[key];
    if (r === null) {
      if (!ax.autorange) update[`${key}.autorange`] = true;
    } else if (ax.autorange || !ax.range || Math.abs(ax.range[0] - r[0]) > 1e-9 * (1 + Math.abs(r[0])) ||
               Math.abs(ax.range[1] - r[1]) > 1e-9 * (1 + Math.abs(r[1]))) {
      update[`${key}.range`] = r;
      update[`${key}.autorange`] = false;
    }
  }
  return Object.keys(update).length ? update : null;
}

function extent(traces, axis, [x0, x1], logScale) {
  let lo = Infinity, hi = -Infinity;
  for (const t of traces) {
    if ((t.yaxis || "y") !== axis || t.visible === false || t.visible === "legendonly") continue;
    const xs = t.x, ys = t.y;
    for (let j = 0; j < xs.length; j++) {
      const x = xs[j];
      if (x === null || x < x0 || x > x1) continue;
      const v = ys[j];
      if (v === null || !Number.isFinite(v) || (logScale && v <= 0)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  return lo <= hi ? [lo, hi] : null;
}

function padded([lo, hi], logScale, tozero) {
  if (logScale) {
    const a = Math.log10(lo), b = Math.log10(hi);
    const pad = Math.max(0.05, (b - a) * 0.06);
    return [a - pad, b + pad];
  }
  if (tozero && lo > 0) lo = 0;
  const pad = hi > lo ? (hi - lo) * 0.06 : Math.max(Math.abs(hi) * 0.1, 0.5);
  return [tozero && lo === 0 ? -pad * 0.25 : lo - pad, hi + pad];
}
