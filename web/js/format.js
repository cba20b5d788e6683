/**
 * Formatting and DOM helpers shared by the dashboard modules.
 *
 * Text from the wire (run names, parameter names, messages) only ever reaches the page
 * through `el()`/`setText()`, which use `textContent`: never innerHTML.
 */

/** Non-finite floats travel as strings ("NaN", "Infinity"); turn them back into numbers. */
export function num(v) {
  if (typeof v === "number") return v;
  if (v === null || v === undefined) return null;
  if (v === "NaN") return NaN;
  if (v === "Infinity") return Infinity;
  if (v === "-Infinity") return -Infinity;
  const x = Number(v);
  return Number.isNaN(x) ? null : x;
}

/** A number plotly can draw, or null (a gap) for NaN/Infinity/missing. */
export function plottable(v) {
  const x = num(v);
  return x === null || !Number.isFinite(x) ? null : x;
}

/** Compact number: 3 significant digits, exponent for very large/small values. */
export function fmt(v) {
  const x = num(v);
  if (x === null) return "–";
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "∞" : "−∞";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(2);
  return Number(x.toPrecision(3)).toString();
}

/** Thousands separators for counts. */
export function count(n) {
  return (n ?? 0).toLocaleString("en-US");
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/** Unix seconds → "Nov 22 06:03" (local time; the year only when it is not this one). */
export function when(unix) {
  if (!unix) return "–";
  const d = new Date(unix * 1000);
  const p = (n) => String(n).padStart(2, "0");
  const year = d.getFullYear() === new Date().getFullYear() ? "" : ` ${d.getFullYear()}`;
  return `${MONTHS[d.getMonth()]} ${d.getDate()}${year} ${p(d.getHours())}:${p(d.getMinutes())}`;
}

/** Seconds → "1h 02m", "3m 05s", "12s". */
export function duration(s) {
  if (!(s >= 0)) return "–";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

/** Create an element; `text` is set with textContent, attributes with setAttribute. */
export function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  if (text !== null && text !== undefined) node.textContent = String(text);
  return node;
}

/** Set an element's text (by id or node) only when it changed, to spare layout work. */
export function setText(target, text) {
  const node = typeof target === "string" ? document.getElementById(target) : target;
  const s = text === null || text === undefined ? "" : String(text);
  if (node && node.textContent !== s) node.textContent = s;
}

/** "steps 120–180" or "step 120". */
export function stepRange(first, last) {
  return first === last ? `step ${count(first)}` : `steps ${count(first)}–${count(last)}`;
}

/**
 * Text for plotly labels (legend names, hover text, tick labels). Plotly reads a few
 * HTML-like tags in label strings; escaping `<`, `>` and `&` makes it show wire text as
 * typed.
 */
export function plotText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/**
 * An optimizer's name as its findings give it (an OptimizerView): its label where the run's
 * code named it ("d_opt"), else its id ("Adam#0").
 */
export function optName(o) {
  return o.label || o.opt;
}

/**
 * Each optimizer's label by its id, for those the run's code named (optName): for the
 * legend, the readout, the header and the parameters' choice, which hold only ids.
 */
export function labelsOf(optimizers) {
  return new Map(optimizers.filter((o) => o.label).map((o) => [o.opt, o.label]));
}
