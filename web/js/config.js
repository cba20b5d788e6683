/**
 * The run's configuration under its facts: the command line it was started with
 * (`Header.argv`) and each optimizer's param-group settings (`OptimizerInfo.hparams`: lr,
 * momentum, betas, weight decay...). Wire text, written with textContent.
 */

import { el, optName, setText } from "./format.js";

const $ = (id) => document.getElementById(id);
/** Settings shown first, in this order; the rest follow by name. */
const FIRST = ["lr", "momentum", "betas", "weight_decay", "eps", "dampening", "nesterov"];

/** A shell-like command line from argv (arguments with spaces quoted). */
export function commandText(argv) {
  return (argv || []).map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`))
    .join(" ");
}

function valueText(v) {
  if (Array.isArray(v)) return `(${v.map(valueText).join(", ")})`;
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(6)));
  if (typeof v === "boolean") return v ? "True" : "False"; // as Python prints them
  return v === null ? "None" : String(v);
}

/** "lr 0.1 · momentum 0.9 · ...": a group's settings, the usual ones first. */
export function groupText(h) {
  const keys = Object.keys(h || {});
  const order = [...FIRST.filter((k) => keys.includes(k)), ...keys.filter((k) => !FIRST.includes(k)).sort()];
  return order.map((k) => `${k} ${valueText(h[k])}`).join(" · ");
}

/**
 * Fill the configuration box.
 * @param {string[]|null} argv the header's command line (null: not known yet)
 * @param {object[]} optimizers OptimizerViews of the run
 */
export function renderConfig(argv, optimizers) {
  const box = $("run-config");
  const cmd = commandText(argv);
  setText("run-command", cmd || "command line not recorded");
  $("run-command").title = cmd;
  const rows = [];
  for (const o of optimizers || []) {
    (o.hparams || []).forEach((h, g) => {
      const who = `${optName(o)}${o.rank ? ` (rank ${o.rank})` : ""} · ${o.cls}` +
        `${o.hparams.length > 1 ? ` · group ${g}` : ""}`;
      const li = el("li");
      li.append(el("span", { class: "who" }, who), el("span", {}, groupText(h)));
      rows.push(li);
    });
  }
  if (!rows.length) rows.push(el("li", { class: "muted" }, "no optimizer settings recorded"));
  $("run-hparams").replaceChildren(...rows);
  box.hidden = false;
}
