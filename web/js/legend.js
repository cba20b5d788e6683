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
    items.push(item(chart, `${name} ‖grad‖`, color, "solid", [base], HELP.norm));
    items.push(item(chart, `${name} fresh`, color, "dotted", [base + 1], HELP.fresh));
    items.push(item(chart, `${name} drift`, color, "solid", [base + 2], HELP.drift));
  });
  items.push(item(chart, "stale steps", "#f26d6d", "thick", [STALE_OVERLAY], HELP.stale));
  items.push(item(chart, "drift = 1", "#8b96a3", "dashed", [], HELP.one));
  box.replaceChildren(...items);
}

const HELP = {
  norm: "Norm of the accumulated gradient each optimizer step read",
  fresh: "Norm of what backward() added since the previous step",
  drift: "‖grad‖ / fresh: 1.0 when every gradient was reset; climbs on a missed reset",
  stale: "Steps that re-read gradients an earlier step had already used",
  one: "Every gradient was reset before its backward",
};

function item(chart, text, color, style, traces, help) {
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
      for (const t of traces) {
        if (on) chart.hidden.delete(t);
        else chart.hidden.add(t);
      }
      window.Plotly.restyle(chart.gd, { visible: on }, traces);
    });
  }
  return b;
}
