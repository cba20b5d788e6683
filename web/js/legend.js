/**
 * The chart's legend, in HTML above the plot: plotly's own legend is redrawn on every
 * extendTraces and costs a good part of each live frame. Each entry toggles its line.
 */

import { N_FIXED, STALE_OVERLAY } from "./events.js";
import { el } from "./format.js";

/** Fill `box` with one entry per plotted line of `chart` (a MainChart). */
export function renderLegend(box, chart, palette) {
  const items = [];
  chart.order.forEach((key, pos) => {
    const s = chart.series.get(key);
    const color = palette[pos % palette.length];
    const base = N_FIXED + pos * 3;
    const name = chart.series.size > 1 || s.rank ? chart.labelText(s) : s.opt;
    items.push(item(chart, `${name} ‖grad‖`, color, "solid", [base]));
    items.push(item(chart, `${name} fresh`, color, "dotted", [base + 1]));
    items.push(item(chart, `${name} drift`, color, "solid", [base + 2]));
  });
  items.push(item(chart, "stale steps", "#f26d6d", "thick", [STALE_OVERLAY]));
  items.push(item(chart, "drift = 1", "#8b96a3", "dashed", []));
  box.replaceChildren(...items);
}

function item(chart, text, color, style, traces) {
  const b = el("button", { type: "button", class: "lg", "aria-pressed": "true",
    title: traces.length ? "Show or hide this line" : null, disabled: !traces.length });
  const sw = el("span", { class: `sw sw-${style}` });
  sw.style.borderColor = color;
  b.append(sw, el("span", {}, text));
  if (traces.length) {
    b.addEventListener("click", () => {
      const on = b.getAttribute("aria-pressed") !== "true";
      b.setAttribute("aria-pressed", String(on));
      window.Plotly.restyle(chart.gd, { visible: on }, traces);
    });
  }
  return b;
}
