/**
 * Loading a step window from the server, and reading one step back out of the loaded rows.
 *
 * Zooming re-fetches the window, downsampled server-side to about two rows per pixel, so
 * a zoomed window shows every step the server has in it. The readout names what the rows
 * hold at a step: the values of each series and its resets and finding facts.
 */

import { fetchSteps } from "./api.js";
import { count, fmt } from "./format.js";
import { resetLabel } from "./kinds.js";
import { appendRows, ingest } from "./series.js";

/** Rows per series to ask for: about two per horizontal pixel of the chart. */
export function maxPoints(gd) {
  const w = (gd && gd.clientWidth) || 1200;
  return Math.max(500, Math.min(8000, Math.round(w * 2)));
}

/**
 * The rows of steps [range] (null: the whole run) of a run as a fresh Map of series. For
 * the whole run, rows `current` holds past the fetched ones (they arrived live while the
 * request was answered) are kept. `norms`: the model's or each rank's (api.fetchSteps).
 *
 * @returns {Promise<{series: Map, ss: object}>} the series and the StepSeries as sent
 */
export async function loadWindow(runId, range, current, points, norms = "model") {
  const ss = await fetchSteps(runId, {
    start: range ? Math.max(0, Math.floor(range[0])) : null,
    end: range ? Math.ceil(range[1]) : null,
    maxPoints: points, norms,
  });
  const fresh = new Map();
  ingest(ss, fresh);
  if (!range) {
    for (const [key, s] of current) {
      const f = fresh.get(key);
      const last = f ? f.lastStep : -1;
      const i = s.step.findIndex((x) => x > last);
      if (i >= 0) appendRows(s, i, fresh);
    }
  }
  return { series: fresh, ss };
}

/**
 * "step 150 · Adam#0: ‖grad‖ 3.2 fresh 0.41 drift 7.8 stale 6 · no reset" for every
 * series; a series whose nearest loaded row is another step says which. `optName`: the
 * run's one optimizer as findings name it, which its zero_grad() resets are named after;
 * `labels`: each optimizer's label by its id ("d_opt" for "Adam#0"), where it has one.
 */
export function readoutText(series, step, optName = null, labels = new Map()) {
  const parts = [`step ${count(step)}`];
  for (const s of series.values()) {
    const i = s.nearest(step);
    if (i < 0) continue;
    const label = series.size > 1 ? `${labels.get(s.opt) || s.opt}: ` : "";
    const at = s.step[i] === step ? "" : `(nearest row: step ${count(s.step[i])}) `;
    const facts = [["stale", s.stale[i]], ["leaked", s.leaked[i]], ["late", s.late[i]],
      ["discarded", s.discarded[i]]].filter(([, n]) => n > 0).map(([k, n]) => ` ${k} ${n}`);
    const resets = (s.resets[i] || []).map((r) => resetLabel(r.how, optName)).join(" + ") || "no reset";
    parts.push(`${label}${at}‖grad‖ ${fmt(s.norm[i])} fresh ${fmt(s.fresh[i])} ` +
      `drift ${fmt(s.drift[i])}${facts.join("")}${s.skipped[i] ? " skipped" : ""} · ${resets}`);
  }
  return parts.join("  |  ");
}
