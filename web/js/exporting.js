/**
 * Exported files: their names (the run's name and id) and the PNG of a chart, which carries
 * what the page shows around the plot: the run's name as a title, a legend of the lines
 * and of the finding bands, and each band labelled with its kind.
 */

import { groupText } from "./config.js";
import { count, optName, plotText, when } from "./format.js";
import { findingKind } from "./kinds.js";
import { css } from "./layout.js";

const PNG = { width: 1400, height: 820 };
/** Pixels between the subtitle and the legend, and between the legend and the plot. */
const LEGEND_GAP = 10;

/** "my-run-name-4989e69d": a file name stem from a run's name and id. */
export function fileStem(name, id) {
  const slug = String(name || "").normalize("NFKD").replace(/[^\w.-]+/g, "-")
    .replace(/-{2,}/g, "-").replace(/^[-.]+|[-.]+$/g, "").slice(0, 60);
  return slug && slug !== id ? `${slug}-${id}` : String(id);
}

/**
 * The figure a PNG export draws: the graph div's visible traces with plotly's legend on,
 * one legend entry per finding kind banded, band labels and a title.
 *
 * @param {HTMLElement} gd a drawn graph div
 * @param {{title: string, subtitle?: string}} opts plain text (escaped here for plotly)
 */
export function exportFigure(gd, { title, subtitle = "" }) {
  // Ungrouped, so the legend reads as one row per line rather than a column per series.
  const data = (gd.data || []).filter((t) => t.visible !== false).map((t) => ({
    ...t, legendgroup: undefined,
    showlegend: t.showlegend !== false && !!(t.meta && (t.meta.field || t.meta.scalar)),
  }));
  const layout = JSON.parse(JSON.stringify(gd.layout));
  const kinds = [];
  layout.shapes = (layout.shapes || []).map((s) => {
    const kind = typeof s.name === "string" && s.name.startsWith("band:") ? s.name.slice(5) : null;
    if (!kind) return s;
    if (!kinds.includes(kind)) kinds.push(kind);
    const k = findingKind(kind);
    return { ...s, label: { text: plotText(k.label), textposition: "top left",
      font: { color: k.color, size: 12 } } };
  });
  for (const kind of kinds) {
    const k = findingKind(kind);
    data.push({
      type: "scatter", mode: "lines", x: [null], y: [null], xaxis: "x", yaxis: "y",
      name: plotText(`${k.label} band: ${k.means}`), showlegend: true, hoverinfo: "skip",
      line: { color: k.band.replace(/[\d.]+\)$/, "0.55)"), width: 12 },
    });
  }
  Object.assign(layout, {
    title: { text: plotText(title), x: 0.01, xanchor: "left", yref: "container", y: 0.97,
      yanchor: "top", font: { size: 17 },
      subtitle: { text: plotText(subtitle), font: { size: 12, color: css("--muted", "#8b96a3") } } },
    showlegend: true,
    // Placed under the subtitle once drawn (drawFigure): how many rows it wraps to
    // depends on its entries, so the plot is moved down by what it took.
    legend: { orientation: "h", x: 0, xanchor: "left", yref: "container", y: 0.9,
      yanchor: "top", traceorder: "normal", font: { size: 11 }, bgcolor: "rgba(0,0,0,0)" },
    margin: { ...layout.margin, t: 120 },
    width: PNG.width, height: PNG.height,
  });
  delete layout.datarevision;
  return { data, layout };
}

/** The PNG figure of a run's chart: its name as the title; its id, status, counts, tags and
 * each optimizer's settings (`OptimizerView.hparams`, first param group) under. */
export function runFigure(gd, run, findings, optimizers = []) {
  return exportFigure(gd, {
    title: run.name || run.id,
    subtitle: `run ${run.id} · ${run.status || ""} · ${count(run.steps || 0)} steps · ` +
      `${findings ? `${count(findings)} finding${findings === 1 ? "" : "s"}` : "no findings"}` +
      ` · started ${when(run.started)}` +
      (run.tags && run.tags.length ? ` · tags: ${run.tags.join(", ")}` : "") +
      settingsText(optimizers),
  });
}

/** " · opt: SGD lr 0.1 · momentum 0.9 (+1 group)" per optimizer with recorded settings. */
function settingsText(optimizers) {
  const parts = optimizers.filter((o) => o.hparams && o.hparams.length).map((o) => {
    const more = o.hparams.length - 1;
    return `${optName(o)}: ${o.cls} ` +
      `${groupText(o.hparams[0])}${more ? ` (+${more} group${more > 1 ? "s" : ""})` : ""}`;
  });
  // Ranks of one launch share their settings: say each once.
  return [...new Set(parts)].map((t) => ` · ${t}`).join("");
}

/**
 * Plot an export `figure` in `box` (a div of the figure's size), its legend under the
 * title and subtitle and the plot under the legend, as measured once drawn.
 */
export async function drawFigure(box, figure) {
  const Plotly = window.Plotly;
  await Plotly.newPlot(box, figure.data, figure.layout, { staticPlot: true });
  const title = box.querySelector(".g-gtitle");
  const legend = box.querySelector(".legend");
  if (!title || !legend) return;
  const top = box.getBoundingClientRect().top;
  const under = title.getBoundingClientRect().bottom - top + LEGEND_GAP;
  const tall = legend.getBoundingClientRect().height;
  await Plotly.relayout(box, { "legend.y": 1 - under / figure.layout.height,
    "margin.t": Math.ceil(under + tall + LEGEND_GAP) });
}

/** Draw `figure` off screen, render it as PNG and hand it to the browser as `filename`. */
export async function downloadFigure(figure, filename) {
  const Plotly = window.Plotly;
  const box = document.createElement("div");
  box.style.cssText = `position:fixed;left:-20000px;top:0;width:${PNG.width}px;height:${PNG.height}px`;
  document.body.append(box);
  try {
    await drawFigure(box, figure);
    const url = await Plotly.toImage(box, { format: "png", ...PNG });
    saveUrl(url, `${filename}.png`);
  } finally {
    Plotly.purge(box);
    box.remove();
  }
}

/** Hand a URL (data: or blob:) to the browser as a download named `name`. */
export function saveUrl(url, name) {
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
}
