/**
 * The run header (name, status, facts, probe drops) and the corner toast. Both show wire
 * text, so both write it with textContent.
 */

import { count, duration, el, setText, when } from "./format.js";

const $ = (id) => document.getElementById(id);

/** Fill the run header from a RunSummary; called several times a second while live. */
export function renderSummary(run) {
  setText("run-name", run.name || run.id);
  $("run-name").title = run.id;
  setText("crumb", run.name || run.id);
  const badge = $("run-status");
  setText(badge, run.status);
  badge.dataset.status = run.status;
  const facts = [
    ["steps", count(run.steps)],
    ["findings", count(run.findings)],
    ["optimizers", (run.optimizers || []).join(", ") || "–"],
    ["ranks", (run.ranks || [0]).length],
    ["started", when(run.started)],
    ["duration", duration((run.updated || run.started) - run.started)],
    ["torch", run.torch_version || "–"],
  ];
  // Built once, then only changed values are written.
  const box = $("run-facts");
  if (box.children.length !== facts.length) {
    box.replaceChildren(...facts.map(([k]) => {
      const d = el("div");
      d.append(el("dt", {}, k), el("dd"));
      return d;
    }));
  }
  facts.forEach(([, v], i) => setText(box.children[i].lastChild, v));
  const dropped = $("run-dropped");
  dropped.hidden = !run.dropped;
  setText(dropped, run.dropped ? `⚠ probe dropped ${count(run.dropped)} records` : "");
  dropped.title = "The probe's queue was full and it had no spool: these records are lost.";
}

let toastTimer = 0;
/** A short message in the corner (export failures, server errors). */
export function showToast(text) {
  const t = $("toast");
  setText(t, text);
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 6000);
}
