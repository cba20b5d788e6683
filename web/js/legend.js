/**
 * The charts' legends, in HTML above the plot: plotly's own legend is redrawn on every
 * extendTraces and costs a good part of each live frame. Each line's entry toggles it; the
 * finding bands get an entry per kind saying what their colour means.
 */

import { N_FIXED, STALE_OVERLAY } from "./events.js";
import { el } from "./format.js";
import { findingKind } from "./kinds.js";
import { PANELS } from "./panels.js";

const STALE_HELP = "Steps that re-read gradients an earlier step had already used";
const ONE_HELP = "Every gradient was reset before its backward";

/** Fill `box` with the run chart's entries: its lines, then the band of each finding kind. */
export function renderLegend(box, chart, perSeries) {
  const items = [];
  chart.order.forEach((key, pos) => {
    const s = chart.series.get(key);
    const color = chart.colorOf(key);
    const name = chart.labelText(s);
    let i = N_FIXED + pos * perSeries;
    PANELS.forEach((panel, p) => {
      const first = i;
      for (const spec of panel.traces) {
        if (spec.smooth || (chart.shown && !chart.shown[p])) { // drawn with its raw line;
          i++; // or a panel the run has no value for
          continue;
        }
        // A raw line's entry shows and hides its smoothed twin with it.
        const twin = panel.traces.findIndex((t) => t.smooth && t.column === spec.column);
        items.push(lineItem(chart, `${name} ${spec.label}`, color, spec.dash ? "dotted" : "solid",
          twin < 0 ? [i++] : [i++, first + twin], spec.help));
      }
    });
  });
  let k = N_FIXED + chart.order.length * perSeries;
  for (const [name] of chart.scalars || []) {
    items.push(lineItem(chart, name, traceColor(chart, k), "solid", [k],
      "A value logged with handle.log (or the trainer's logging)"));
    k++;
  }
  items.push(lineItem(chart, "stale steps", "#f26d6d", "thick", [STALE_OVERLAY], STALE_HELP));
  items.push(lineItem(chart, "drift = 1", "#8b96a3", "dashed", [], ONE_HELP));
  items.push(...bandItems(chart.findingList.map((f) => f.kind)));
  box.replaceChildren(...items);
}

/** The colour of trace `i` as drawn. */
function traceColor(chart, i) {
  const t = chart.gd && chart.gd.data && chart.gd.data[i];
  return t && t.line ? t.line.color : "#8b96a3";
}

/** One entry per finding kind present: its band colour and what the band marks. */
export function bandItems(kinds) {
  return [...new Set(kinds)].map((kind) => {
    const k = findingKind(kind);
    const item = el("span", { class: "lg band", title: `Band: ${k.means}`, dataset: { kind } });
    const sw = el("span", { class: "sw-band" });
    sw.style.background = k.band;
    sw.style.borderColor = k.color;
    item.append(sw, el("span", {}, `${k.label} band`));
    return item;
  });
}

/** A legend entry for plotted traces (toggles them), or a plain key when `traces` is empty. */
export function lineItem(chart, text, color, style, traces, help) {
  const shown = !traces.some((t) => chart.hidden.has(t));
  const b = el("button", { type: "button", class: "lg", "aria-pressed": String(shown),
    title: traces.length ? `${help} (click to show or hide)` : help, disabled: !traces.length });
  const sw = el("span", { class: `sw sw-${style}` });
  sw.style.borderColor = color;
  b.append(sw, el("span", {}, text));
  if (traces.length) {
    b.addEventListener("click", () => {
      const on = b.getAttribute("aria-pressed") !== "true";
      b.setAttribute("aria-pressed", String(on));
      chart.setVisible(traces, on);
    });
  }
  return b;
}
