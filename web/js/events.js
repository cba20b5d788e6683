/**
 * The event strip under the charts: which rows it has, and the bar geometry of each
 * series' events (resets by how, stale, late and discarded steps).
 */

/**
 * Rows of the event strip under the charts, top to bottom: the finding facts, then resets
 * by how they happened. [key, strip label, colour, hover text].
 */
export const EVENT_ROWS = [
  ["stale", "stale", "#f26d6d", "stale or leaked gradients read"],
  ["late", "late reset", "#e3a13b", "fresh gradient reset before step"],
  ["discarded", "discarded", "#d97bd0", "backward discarded unused"],
  ["skipped", "skipped", "#8b96a3", "step skipped (GradScaler found inf/NaN)"],
  ["optimizer_zero_grad", "opt.zero_grad", "#5aa9ff", "reset: optimizer.zero_grad()"],
  ["module_zero_grad", "mod.zero_grad", "#3fb950", "reset: module.zero_grad()"],
  ["set_none", "grad=None", "#8b96a3", "reset: p.grad = None"],
  ["zero_", "grad.zero_", "#e3a13b", "reset: p.grad.zero_()"],
  ["replaced", "replaced", "#b58cff", "reset: p.grad replaced"],
];
export const ROW_INDEX = new Map(EVENT_ROWS.map(([key], k) => [key, k]));
export const N_ROWS = EVENT_ROWS.length;
/** Fixed traces before the per-series ones: one per event row, then the stale overlay. */
export const STALE_OVERLAY = N_ROWS;
export const N_FIXED = N_ROWS + 1;
/**
 * Points of the fixed traces for rows [from, to) of series s.
 *
 * Events are drawn as bars on their strip row, one small rectangle per run of
 * consecutive rows (a reset at every step is one bar, not thousands of ticks), as one
 * SVG path per row: markers would cost a DOM node each and make every redraw slow. The
 * rectangle's edges keep a lone event visible at any zoom. Stale rows also paint the
 * drift line red, from the row before.
 */
export function eventPoints(s, from, to, out) {
  const open = new Array(N_ROWS).fill(null); // per row: [firstStep, lastStep, lastIndex]
  const close = (k) => {
    const r = open[k];
    if (!r) return;
    const x0 = r[0] - 0.45, x1 = r[1] + 0.45, y0 = k - 0.32, y1 = k + 0.32;
    out[k].x.push(x0, x0, x1, x1, x0, null);
    out[k].y.push(y0, y1, y1, y0, y0, null);
    open[k] = null;
  };
  const mark = (k, x, i) => {
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
  const staleRow = ROW_INDEX.get("stale");
  let inStale = false;
  for (let i = from; i < to; i++) {
    const x = s.step[i];
    const resets = s.resets[i];
    if (resets && resets.length) {
      for (const r of resets) {
        const k = ROW_INDEX.get(r.how);
        if (k !== undefined) mark(k, x, i);
      }
    }
    if (s.stale[i] > 0 || s.leaked[i] > 0) {
      mark(staleRow, x, i);
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
    if (s.late[i] > 0) mark(ROW_INDEX.get("late"), x, i);
    if (s.discarded[i] > 0) mark(ROW_INDEX.get("discarded"), x, i);
  }
  for (let k = 0; k < N_ROWS; k++) close(k);
  if (inStale) {
    overlay.x.push(null);
    overlay.y.push(null);
  }
}
