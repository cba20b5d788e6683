/**
 * The event strip under the run chart: which rows it can have, which it shows (only the
 * kinds of event the run has, so labels get room to be read), and the bar geometry of each
 * series' events (resets by kind, stale, late and discarded steps).
 */

import { RESET_KINDS } from "./kinds.js";

/**
 * Rows the strip can show, top to bottom: the finding facts, then resets by kind.
 * [key, strip label, colour, hover text]. Reset rows take their names from kinds.js.
 */
export const EVENT_ROWS = [
  ["stale", "stale grads", "#f26d6d", "stale or leaked gradients read"],
  ["late", "late reset", "#e3a13b", "fresh gradient reset before step"],
  ["discarded", "discarded", "#d97bd0", "backward discarded unused"],
  ["skipped", "skipped step", "#8b96a3", "step skipped (GradScaler found inf/NaN)"],
  ...Object.entries(RESET_KINDS).map(([how, k]) => [how, k.label, k.color, k.says]),
];
export const ROW_INDEX = new Map(EVENT_ROWS.map(([key], k) => [key, k]));
export const N_ROWS = EVENT_ROWS.length;
/** Fixed traces before the per-series ones: one per event row, then the stale overlay. */
export const STALE_OVERLAY = N_ROWS;
export const N_FIXED = N_ROWS + 1;

/** Keys of the rows any of these series has an event on, in strip order. */
export function usedRows(series) {
  const used = new Set();
  for (const s of series) {
    for (let i = 0; i < s.length; i++) {
      for (const r of s.resets[i] || []) used.add(r.how);
      if (s.stale[i] > 0 || s.leaked[i] > 0) used.add("stale");
      if (s.late[i] > 0) used.add("late");
      if (s.discarded[i] > 0) used.add("discarded");
      if (s.skipped[i]) used.add("skipped");
    }
  }
  return EVENT_ROWS.map(([key]) => key).filter((key) => used.has(key));
}

/**
 * Points of the fixed traces for rows [from, to) of series s, with each shown row at its
 * position in `pos` (row key -> strip position). Events on a row not in `pos` are left
 * out and their row keys added to `out.missing`: the strip needs a new row.
 *
 * Events are drawn as bars, one small rectangle per run of consecutive rows (a reset at
 * every step is one bar, not thousands of ticks), as one SVG path per row: markers would
 * cost a DOM node each and make every redraw slow. The rectangle's edges keep a lone event
 * visible at any zoom. Stale rows also paint the drift line red, from the row before.
 */
export function eventPoints(s, from, to, out, pos) {
  const open = new Array(N_ROWS).fill(null); // per row: [firstStep, lastStep, lastIndex]
  const close = (k) => {
    const r = open[k];
    if (!r) return;
    const y = pos.get(EVENT_ROWS[k][0]);
    const x0 = r[0] - 0.45, x1 = r[1] + 0.45, y0 = y - 0.32, y1 = y + 0.32;
    out[k].x.push(x0, x0, x1, x1, x0, null);
    out[k].y.push(y0, y1, y1, y0, y0, null);
    open[k] = null;
  };
  const mark = (key, x, i) => {
    const k = ROW_INDEX.get(key);
    if (k === undefined) return;
    if (!pos.has(key)) {
      out.missing.add(key);
      return;
    }
    const r = open[k];
    if (r && r[2] === i - 1) {
      r[1] = x;
      r[2] = i;
    } else {
      close(k);
      open[k] = [x, x, i];
    }
  };
  const overlay = out[STALE_OVERLAY];
  let inStale = false;
  for (let i = from; i < to; i++) {
    const x = s.step[i];
    for (const r of s.resets[i] || []) mark(r.how, x, i);
    if (s.stale[i] > 0 || s.leaked[i] > 0) {
      mark("stale", x, i);
      if (!inStale) {
        const j = i > 0 ? i - 1 : i;
        overlay.x.push(s.step[j]);
        overlay.y.push(s.drift[j]);
        inStale = true;
      }
      overlay.x.push(x);
      overlay.y.push(s.drift[i]);
    } else if (inStale) {
      overlay.x.push(null);
      overlay.y.push(null);
      inStale = false;
    }
    if (s.late[i] > 0) mark("late", x, i);
    if (s.discarded[i] > 0) mark("discarded", x, i);
    if (s.skipped[i]) mark("skipped", x, i);
  }
  for (let k = 0; k < N_ROWS; k++) close(k);
  if (inStale) {
    overlay.x.push(null);
    overlay.y.push(null);
  }
}

/** Empty point lists for the fixed traces, plus the set of rows found missing. */
export function emptyPoints() {
  const out = Array.from({ length: N_FIXED }, () => ({ x: [], y: [] }));
  out.missing = new Set();
  return out;
}
