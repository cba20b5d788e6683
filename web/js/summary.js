/**
 * The run header: name, status, facts, probe drops and how the steps shown were sampled;
 * and the page that says a run is missing. They show wire text, so they write it with
 * textContent.
 */

import { count, duration, el, setText, when } from "./format.js";

const $ = (id) => document.getElementById(id);

/**
 * Fill the run header from a RunSummary; called several times a second while live.
 * `labels`: each optimizer's label by its id, shown instead of the id where there is one.
 */
export function renderSummary(run, labels = new Map()) {
  setText("run-name", run.name || run.id);
  // The name may be cut to fit the header: whole on hover, with the id.
  $("run-name").title = run.name && run.name !== run.id ? `${run.name} (run ${run.id})` : run.id;
  setText("crumb", run.name || run.id);
  const badge = $("run-status");
  setText(badge, run.status);
  badge.dataset.status = run.status;
  const facts = [
    ["steps", count(run.steps)],
    ["findings", count(run.findings)],
    ["optimizers", (run.optimizers || []).map((o) => labels.get(o) || o).join(", ") || "–"],
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

/** Empty the header for a run whose summary has not arrived yet. */
export function clearSummary(runId) {
  setText("run-name", runId);
  setText("run-status", "");
  $("run-facts").replaceChildren();
  $("run-dropped").hidden = true;
  setText("sampling", "");
}

/** How the rows on the chart were sampled (a StepSeries' bucket and totals). */
export function renderSampling(ss) {
  if (!ss) return;
  setText("sampling", ss.downsampled
    ? `showing ${count(ss.step.length)} of ${count(ss.total)} rows (min/max per ${count(ss.bucket)} steps)`
    : "");
}

/** The server holds no run `runId` (or it was just deleted): say so, with a link back. */
export function renderMissing(runId, deleted) {
  $("run").hidden = true;
  $("missing").hidden = false;
  setText("missing-title", deleted ? "Run deleted" : "Run not found");
  setText("missing-id", runId);
  setText("missing-why", deleted ? " was deleted." : " is not on this server.");
  document.title = `${deleted ? "Run deleted" : "Run not found"} · gradwatch`;
  setText("crumb", "");
}
