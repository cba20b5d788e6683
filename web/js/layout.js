/**
 * Layouts of the step-axis figures: the panels of panels.js on one step axis (plus, on the
 * run chart, the event strip), colours from the page's CSS, the 1.0 drift line, finding
 * bands and the step cursor.
 */

import { EVENT_ROWS, ROW_INDEX } from "./events.js";
import { RESET_KINDS, resetLabel } from "./kinds.js";
import { findingKind } from "./kinds.js";
import { PANELS, axisId, axisKey, panelDomains, panelIndex } from "./panels.js";

/** Strip row pitch in pixels: room for an 11 px label per row. */
const ROW_PX = 17;
/** Least pixels between two tick labels of a panel's y axis: a log axis labels "10⁻³" and
 * the 2s and 5s between decades, which collide in a short panel (the lr panel) otherwise. */
const TICK_PX = 36;
/** Top and bottom margins of the step-axis figures, in pixels. */
const MARGIN_T = 10, MARGIN_B = 40;

/** Left margin of the run chart: the strip's labels ("model.zero_grad()") fit in it. */
export const STRIP_MARGIN = 124;
/** The most the margin grows for a long optimizer name in the strip's reset row. */
const STRIP_MARGIN_MAX = 300;

export function css(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

/** Plotly config of the step-axis figures. */
export function chartConfig() {
  return {
    responsive: true,
    displaylogo: false,
    scrollZoom: false,
    doubleClick: "reset",
    modeBarButtonsToRemove: ["select2d", "lasso2d", "toImage"],
  };
}

/** Show steps [a, b] (range) or the whole run (null). The y axes are fitted by panels.fitY. */
export function applyRange(layout, range) {
  if (range) {
    layout.xaxis.range = [range[0], range[1]];
    layout.xaxis.autorange = false;
  } else {
    layout.xaxis.autorange = true;
    delete layout.xaxis.range;
  }
}

function base(logScale, below, margin, shown = null, height = 0) {
  const text = css("--text", "#d8dee6");
  const muted = css("--muted", "#8b96a3");
  const grid = css("--line", "#2a323d");
  const axis = { gridcolor: grid, zerolinecolor: grid, linecolor: grid, tickfont: { color: muted } };
  const layout = {
    // Opaque, so an exported PNG looks like the page.
    paper_bgcolor: css("--panel", "#161b22"),
    plot_bgcolor: css("--panel", "#161b22"),
    font: { family: css("--font", "sans-serif"), size: 12, color: text },
    margin: { l: margin, r: 16, t: MARGIN_T, b: MARGIN_B },
    // The legend is HTML above the chart (legend.js): plotly's own legend is redrawn on
    // every extendTraces and costs a good part of each live frame.
    showlegend: false,
    hovermode: "x",
    hoverlabel: { bgcolor: "#1c232c", bordercolor: grid, font: { color: text } },
    dragmode: "zoom",
    xaxis: { ...axis, title: { text: "optimizer step", font: { color: muted } },
      showspikes: true, spikemode: "across", spikethickness: 1, spikecolor: muted },
  };
  const domains = panelDomains(below, shown);
  const plotPx = Math.max(0, height - MARGIN_T - MARGIN_B);
  PANELS.forEach((p, i) => {
    if (!domains[i] && !p.traces.length) return; // hidden, and no trace refers to it
    const px = domains[i] ? (domains[i][1] - domains[i][0]) * plotPx : 0;
    layout[axisKey(i)] = {
      ...axis, domain: domains[i] || [0, 0.001], type: logScale ? "log" : "linear",
      fixedrange: true, exponentformat: "power",
      // At most one label per TICK_PX (plotly treats nticks as a most); 0: plotly's own.
      nticks: px ? Math.max(2, Math.floor(px / TICK_PX)) : 0,
      rangemode: p.tozero && !logScale ? "tozero" : "normal",
      title: { text: p.title, font: { color: muted } }, autorange: true,
    };
    // A panel the run has no value for: its axis is kept (its traces refer to it) unseen.
    if (!domains[i]) layout[axisKey(i)].visible = false;
  });
  return { layout, axis, muted };
}

/**
 * The run chart's layout: the panels, and under them the event strip with one row per key
 * of `rows` (the kinds of event the run has).
 *
 * @param {{logScale: boolean, range: number[]|null, shapes: object[], rows: string[],
 *   height: number, optName: string|null}} opts height: the graph div's height in pixels;
 *   optName: the run's one optimizer as its findings name it, which its resets row names
 */
export function chartLayout({ logScale, range, shapes, rows, height, shown = null,
  optName = null }) {
  const n = Math.max(1, rows.length);
  const below = stripFraction(n, height);
  const ticktext = rows.map((key) => (key in RESET_KINDS ? resetLabel(key, optName)
    : EVENT_ROWS[ROW_INDEX.get(key)][1]));
  // a reset row named after the optimizer ("encoder_opt.zero_grad()") may need more room
  const longest = Math.max(0, ...ticktext.map((t) => t.length));
  const margin = Math.min(STRIP_MARGIN_MAX, Math.max(STRIP_MARGIN, Math.ceil(longest * 7.3) + 4));
  const { layout, axis, muted } = base(logScale, below, margin, shown, height);
  const strip = axisKey(PANELS.length);
  layout.xaxis.anchor = axisId(PANELS.length);
  layout[strip] = {
    ...axis, domain: [0, below], fixedrange: true, showgrid: false, zeroline: false,
    range: [n - 0.5, -0.5], tickmode: "array", tickvals: rows.map((_, k) => k), ticktext,
    tickfont: { color: muted, size: 11 }, automargin: false,
  };
  layout.shapes = shapes;
  applyRange(layout, range);
  return layout;
}

/** Height of an event strip of `n` rows, as a fraction of a figure `height` px high. */
export function stripFraction(n, height) {
  const plotH = Math.max(200, (height || 500) - MARGIN_T - MARGIN_B);
  return Math.min(0.35, (Math.max(1, n) * ROW_PX + 6) / plotH);
}

/** The compare chart's layout: the panels it compares only, the step axis under the last. */
export function compareLayout({ logScale, range, shapes, shown, height = 0 }) {
  const { layout } = base(logScale, 0, 78, shown, height);
  layout.xaxis.anchor = axisId(shown.lastIndexOf(true));
  layout.shapes = shapes;
  applyRange(layout, range);
  return layout;
}

/** Top of the strip, as a fraction of the plot: where finding bands start. */
function bandBottom(layout) {
  let lo = null;
  PANELS.forEach((_, i) => {
    const ax = layout[axisKey(i)];
    if (ax && ax.visible !== false && (lo === null || ax.domain[0] < lo)) lo = ax.domain[0];
  });
  return lo === null ? 0 : Math.max(0, lo - 0.015);
}

/**
 * A translucent band over each finding's steps (above the event strip), named
 * `band:<kind>` so an export can label it; the selected finding's band is outlined.
 */
export function findingShapes(findings, layout, activeKey = null, keyOf = null) {
  const y0 = layout ? bandBottom(layout) : 0.23;
  return findings.map((f) => {
    const kind = findingKind(f.kind);
    const active = activeKey !== null && keyOf && keyOf(f) === activeKey;
    return {
      type: "rect", xref: "x", yref: "paper", x0: f.first_step - 0.5, x1: f.last_step + 0.5,
      y0, y1: 1, fillcolor: kind.band, name: `band:${f.kind}`,
      line: active ? { width: 1.5, color: kind.color } : { width: 0 }, layer: "below",
    };
  });
}

/** The drift = 1 line (the healthy level), on the drift panel. */
export function driftOneLine() {
  return {
    type: "line", xref: "paper", x0: 0, x1: 1, yref: axisId(panelIndex("drift")), y0: 1, y1: 1,
    line: { color: "#8b96a3", width: 1, dash: "dash" }, layer: "below",
  };
}

/** All shapes of the run chart: the drift = 1 line, the finding bands, the step cursor. */
export function chartShapes(bands, cursor) {
  const out = [driftOneLine(), ...bands];
  if (cursor !== null) {
    out.push({ type: "line", xref: "x", x0: cursor, x1: cursor, yref: "paper", y0: 0,
      y1: 1, line: { color: "#d8dee6", width: 1 } });
  }
  return out;
}
