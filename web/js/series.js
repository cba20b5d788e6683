/**
 * The client-side copy of a run's step rows, split per (rank, optimizer) series.
 *
 * Rows come from the server's columnar StepSeries (snapshot, live `steps` frames, and
 * range re-fetches on zoom). What the charts draw is derived from these arrays, so the
 * chart and this store always agree. Long live runs are compacted here with the same rule
 * the server uses (min and max of norm and drift per step bucket, plus every flagged row),
 * so a spike or a stale step never disappears from view.
 */

import { plottable } from "./format.js";

const COLUMNS = [
  "step", "norm", "fresh", "drift", "stale", "leaked", "late", "discarded", "skipped", "resets",
];

/** One (rank, optimizer) series: parallel arrays, one element per plotted step row. */
export class Series {
  constructor(rank, opt) {
    this.rank = rank;
    this.opt = opt;
    this.key = seriesKey(rank, opt);
    for (const c of COLUMNS) this[c] = [];
  }

  get length() {
    return this.step.length;
  }

  get lastStep() {
    return this.step.length ? this.step[this.step.length - 1] : -1;
  }

  /** Index of the row whose step is nearest to `step` (binary search), or -1. */
  nearest(step) {
    const a = this.step;
    if (!a.length) return -1;
    let lo = 0, hi = a.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (a[mid] < step) lo = mid + 1;
      else hi = mid;
    }
    if (lo > 0 && Math.abs(a[lo - 1] - step) <= Math.abs(a[lo] - step)) return lo - 1;
    return lo;
  }

  /** True when row i carries something the charts must keep visible. */
  flagged(i) {
    return this.stale[i] > 0 || this.leaked[i] > 0 || this.late[i] > 0 || this.discarded[i] > 0 ||
      this.skipped[i];
  }
}

export function seriesKey(rank, opt) {
  return `${rank}\u0000${opt}`;
}

/**
 * Split a StepSeries into rows per series.
 *
 * @param {object} ss StepSeries (columnar) from the server
 * @param {Map<string, Series>} into existing series to append to (rows at or before a
 *   series' last step are dropped, so an overlap between a snapshot and a live frame
 *   never draws a point twice)
 * @returns {{added: Map<string, {series: Series, from: number}>, created: Series[]}}
 *   per touched series, the index of its first new row; and the series that are new
 */
export function ingest(ss, into) {
  const added = new Map();
  const created = [];
  const n = ss && ss.step ? ss.step.length : 0;
  for (let i = 0; i < n; i++) {
    const rank = ss.rank ? ss.rank[i] : 0;
    const opt = ss.opt[i];
    const key = seriesKey(rank, opt);
    let s = into.get(key);
    if (!s) {
      s = new Series(rank, opt);
      into.set(key, s);
      created.push(s);
    }
    const step = ss.step[i];
    if (step <= s.lastStep) continue;
    if (!added.has(key)) added.set(key, { series: s, from: s.length });
    s.step.push(step);
    s.norm.push(plottable(ss.norm[i]));
    s.fresh.push(plottable(ss.fresh_norm[i]));
    s.drift.push(plottable(ss.drift[i]));
    s.stale.push(ss.stale ? ss.stale[i] : 0);
    s.leaked.push(ss.leaked ? ss.leaked[i] : 0);
    s.late.push(ss.late ? ss.late[i] : 0);
    s.discarded.push(ss.discarded ? ss.discarded[i] : 0);
    s.skipped.push(ss.skipped ? !!ss.skipped[i] : false);
    s.resets.push(ss.resets ? ss.resets[i] || [] : []);
  }
  return { added, created };
}

/**
 * Downsample a series in place to about `target` rows: per bucket of steps keep the rows
 * holding the min and max of norm and of drift, and every flagged row or row with an
 * unusual reset. Returns true when rows were dropped.
 */
export function compact(s, target) {
  const n = s.length;
  if (n <= target) return false;
  const first = s.step[0], last = s.step[n - 1];
  const buckets = Math.max(1, Math.floor(target / 4));
  const width = Math.max(1, (last - first + 1) / buckets);
  const keep = new Uint8Array(n);
  const usual = dominantHow(s.resets);
  let start = 0;
  while (start < n) {
    const b = Math.floor((s.step[start] - first) / width);
    let end = start;
    while (end < n && Math.floor((s.step[end] - first) / width) === b) end++;
    let nMin = -1, nMax = -1, dMin = -1, dMax = -1;
    // Flagged rows are kept, but at most the first and last of each kind per bucket: a
    // run that is stale at every step must still compact.
    let fFirst = -1, fLast = -1, rFirst = -1, rLast = -1;
    for (let i = start; i < end; i++) {
      const v = s.norm[i], d = s.drift[i];
      if (v !== null) {
        if (nMin < 0 || v < s.norm[nMin]) nMin = i;
        if (nMax < 0 || v > s.norm[nMax]) nMax = i;
      }
      if (d !== null) {
        if (dMin < 0 || d < s.drift[dMin]) dMin = i;
        if (dMax < 0 || d > s.drift[dMax]) dMax = i;
      }
      if (s.flagged(i)) {
        if (fFirst < 0) fFirst = i;
        fLast = i;
      }
      if (unusualReset(s.resets[i], usual)) {
        if (rFirst < 0) rFirst = i;
        rLast = i;
      }
    }
    for (const i of [start, nMin, nMax, dMin, dMax, fFirst, fLast, rFirst, rLast]) {
      if (i >= 0) keep[i] = 1;
    }
    start = end;
  }
  keep[n - 1] = 1;
  for (const c of COLUMNS) {
    const src = s[c];
    const dst = [];
    for (let i = 0; i < n; i++) if (keep[i]) dst.push(src[i]);
    s[c] = dst;
  }
  return true;
}

function dominantHow(resetLists) {
  const counts = new Map();
  for (const list of resetLists) {
    for (const r of list) counts.set(r.how, (counts.get(r.how) || 0) + 1);
  }
  let best = null, bestN = 0;
  for (const [how, c] of counts) if (c > bestN) [best, bestN] = [how, c];
  return best;
}

function unusualReset(resets, usual) {
  return !!resets && resets.some((r) => r.how !== usual);
}
