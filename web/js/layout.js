/**
 * Layout of the main figure: three panels on one step axis (norm, drift, event strip),
 * colours from the page's CSS, the 1.0 drift line, finding shading and the step cursor.
 */

import { EVENT_ROWS, N_ROWS } from "./events.js";

const FINDING_COLORS = {
  missed_reset: "rgba(242,109,109,0.13)",
  late_reset: "rgba(227,161,59,0.15)",
  cross_optimizer_leak: "rgba(181,140,255,0.15)",
  discarded_accumulation: "rgba(217,123,208,0.13)",
};

function css(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

/** Plotly config of the main figure. */
export function chartConfig() {
  return {
    responsive: true,
    displaylogo: false,
    scrollZoom: false,
    doubleClick: "reset",
    modeBarButtonsToRemove: ["select2d", "lasso2d", "toImage"],
  };
}

/** Show steps [a, b] (range) or the whole run (null); y axes always fit the data shown. */
export function applyRange(layout, range) {
  if (range) {
    layout.xaxis.range = [range[0], range[1]];
    layout.xaxis.autorange = false;
  } else {
    layout.xaxis.autorange = true;
    delete layout.xaxis.range;
  }
  for (const ax of ["yaxis", "yaxis2"]) layout[ax].autorange = true;
}

/** The figure's layout. */
export function chartLayout(logScale, range, shapes) {
  const text = css("--text", "#d8dee6");
  const muted = css("--muted", "#8b96a3");
  const grid = css("--line", "#2a323d");
  const axis = { gridcolor: grid, zerolinecolor: grid, linecolor: grid, tickfont: { color: muted } };
  const yType = logScale ? "log" : "linear";
  const layout = {
    // Opaque, so an exported PNG looks like the page.
    paper_bgcolor: css("--panel", "#161b22"),
    plot_bgcolor: css("--panel", "#161b22"),
    font: { family: css("--font", "sans-serif"), size: 12, color: text },
    margin: { l: 78, r: 16, t: 10, b: 40 },
    // The legend is HTML above the chart (legend.js): plotly's own legend is redrawn on
    // every extendTraces and costs a good part of each live frame.
    showlegend: false,
    hovermode: "x",
    hoverlabel: { bgcolor: "#1c232c", bordercolor: grid, font: { color: text } },
    dragmode: "zoom",
    xaxis: { ...axis, anchor: "y3", title: { text: "optimizer step", font: { color: muted } },
      showspikes: true, spikemode: "across", spikethickness: 1, spikecolor: muted },
    yaxis: { ...axis, domain: [0.55, 1], type: yType, fixedrange: true, exponentformat: "power",
      title: { text: "‖grad‖", font: { color: muted } } },
    yaxis2: { ...axis, domain: [0.25, 0.51], type: yType, fixedrange: true,
      rangemode: logScale ? "normal" : "tozero", title: { text: "drift", font: { color: muted } } },
    yaxis3: { ...axis, domain: [0, 0.21], fixedrange: true, showgrid: false, zeroline: false,
      range: [N_ROWS - 0.5, -0.5], tickmode: "array", tickvals: EVENT_ROWS.map((_, k) => k),
      ticktext: EVENT_ROWS.map((r) => r[1]), tickfont: { color: muted, size: 9 } },
    shapes,
  };
  applyRange(layout, range);
  return layout;
}

/** Translucent bands over each finding's steps (above the event strip). */
export function findingShapes(findings) {
  return findings.map((f) => ({
    type: "rect", xref: "x", yref: "paper", x0: f.first_step - 0.5, x1: f.last_step + 0.5,
    y0: 0.23, y1: 1, fillcolor: FINDING_COLORS[f.kind] || "rgba(242,109,109,0.12)",
    line: { width: 0 }, layer: "below",
  }));
}

/** All shapes: the drift = 1 line, the finding bands and the player's step cursor. */
export function chartShapes(bands, cursor) {
  const one = {
    type: "line", xref: "paper", x0: 0, x1: 1, yref: "y2", y0: 1, y1: 1,
    line: { color: "#8b96a3", width: 1, dash: "dash" }, layer: "below",
  };
  const out = [one, ...bands];
  if (cursor !== null) {
    out.push({ type: "line", xref: "x", x0: cursor, x1: cursor, yref: "paper", y0: 0,
      y1: 1, line: { color: "#d8dee6", width: 1 } });
  }
  return out;
}
