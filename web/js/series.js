/**
 * The client-side copy of a run's step rows, split per (rank, optimizer) series.
 *
 * Rows come from the server's columnar StepSeries (snapshot, live `steps` frames, and
 * range re-fetches on zoom). What the charts draw is derived from these arrays, so the
 * chart and this store always agree. Two rules here mirror the server's, and a test holds
 * both sides to one fixture (tests/server/rows_fixture.json): `mustKeep` is
 * gradwatch.server.rows.must_keep, and `compact` downsamples a long live series by
 * gradwatch.server.downsampling, so a spike or a stale step never disappears from view.
 */

import { num, plottable } from "./format.js";

/**
 * Plotted value columns of a Series -> the StepSeries column they come from. A new quantity
 * per step is one entry here and one panel trace in panels.js. `lr` holds a list per step
 * (one learning rate per param group): the Series keeps the first group's.
 */
export const VALUE_COLUMNS = {
  norm: "norm", fresh: "fresh_norm", drift: "drift", loss: "loss", lr: "lr",
};

const COLUMNS = [
  "step", "t", ...Object.keys(VALUE_COLUMNS), "stale", "leaked", "late", "discarded", "skipped",
  "resets", "keep",
];

/** Rows a downsampling bucket keeps at most (the server's ROWS_PER_BUCKET). */
export const ROWS_PER_BUCKET = 6;

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

  /** True when row i must never be lost (`mustKeep` of the row as it arrived). */
  flagged(i) {
    return this.keep[i];
  }
}

/**
 * True when row i of a StepSeries (columns as on the wire) must never be lost, however it
 * is downsampled: a finding fact (stale, leaked, late or discarded > 0), a skipped step, or
 * a NaN or infinite norm or drift. The server's rule, gradwatch.server.rows.must_keep.
 */
export function mustKeep(ss, i) {
  const count = (col) => (ss[col] ? Number(ss[col][i]) || 0 : 0);
  return count("stale") > 0 || count("leaked") > 0 || count("late") > 0 ||
    count("discarded") > 0 || !!(ss.skipped && ss.skipped[i]) ||
    nonFinite(ss.norm[i]) || nonFinite(ss.drift[i]);
}

function nonFinite(v) {
  const x = num(v);
  return x !== null && !Number.isFinite(x);
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
    s.t.push(ss.t && Number.isFinite(ss.t[i]) ? ss.t[i] : (s.t.length ? s.t[s.t.length - 1] : 0));
    for (const [col, wire] of Object.entries(VALUE_COLUMNS)) {
      let v = ss[wire] ? ss[wire][i] : null;
      if (Array.isArray(v)) v = v.length ? v[0] : null; // lr: the first param group's
      s[col].push(plottable(v));
    }
    s.stale.push(ss.stale ? ss.stale[i] : 0);
    s.leaked.push(ss.leaked ? ss.leaked[i] : 0);
    s.late.push(ss.late ? ss.late[i] : 0);
    s.discarded.push(ss.discarded ? ss.discarded[i] : 0);
    s.skipped.push(ss.skipped ? !!ss.skipped[i] : false);
    s.resets.push(ss.resets ? ss.resets[i] || [] : []);
    s.keep.push(mustKeep(ss, i));
  }
  return { added, created };
}

/**
 * Append rows [from, end) of series `s` to its series in `into` (created if missing); rows
 * at or before that series' last step are dropped, as `ingest` drops them.
 */
export function appendRows(s, from, into) {
  let t = into.get(s.key);
  if (!t) {
    t = new Series(s.rank, s.opt);
    into.set(s.key, t);
  }
  for (let i = from; i < s.length; i++) {
    if (s.step[i] <= t.lastStep) continue;
    for (const c of COLUMNS) t[c].push(s[c][i]);
  }
}

/** Steps per bucket so that the buckets over [lo, hi] keep at most `maxPoints` rows. */
export function bucketSize(lo, hi, maxPoints) {
  const buckets = Math.max(1, Math.floor(maxPoints / ROWS_PER_BUCKET));
  return Math.max(1, Math.ceil((hi - lo + 1) / buckets));
}

/**
 * Indices of the rows the server's downsampling keeps of a series with more than
 * `maxPoints` rows (all of them otherwise): per bucket of `bucketSize` steps, the rows of
 * the min and max finite norm and drift (the earliest on a tie), the first row that must be
 * kept and the first row whose reset kinds differ from the bucket's usual ones (those most
 * rows have; on a tie, those seen first); and the series' first and last rows.
 */
export function keptRows(s, maxPoints) {
  const n = s.length;
  if (n <= maxPoints) return Array.from({ length: n }, (_, i) => i);
  const size = bucketSize(s.step[0], s.step[n - 1], maxPoints);
  const keep = new Set([0, n - 1]);
  let start = 0;
  while (start < n) {
    const k = Math.floor(s.step[start] / size);
    let end = start;
    while (end < n && Math.floor(s.step[end] / size) === k) end++;
    for (const i of bucketKeeps(s, start, end)) keep.add(i);
    start = end;
  }
  return [...keep].sort((a, b) => a - b);
}

function bucketKeeps(s, start, end) {
  let nLo = -1, nHi = -1, dLo = -1, dHi = -1, flag = -1;
  const sigs = new Map(); // reset kinds -> [rows, first index]
  for (let i = start; i < end; i++) {
    const v = s.norm[i], d = s.drift[i]; // plottable: null unless finite
    if (v !== null) {
      if (nLo < 0 || v < s.norm[nLo]) nLo = i;
      if (nHi < 0 || v > s.norm[nHi]) nHi = i;
    }
    if (d !== null) {
      if (dLo < 0 || d < s.drift[dLo]) dLo = i;
      if (dHi < 0 || d > s.drift[dHi]) dHi = i;
    }
    if (flag < 0 && s.keep[i]) flag = i;
    const sig = resetSig(s.resets[i]);
    const seen = sigs.get(sig);
    if (seen) seen[0]++;
    else sigs.set(sig, [1, i]);
  }
  let usual = null;
  for (const [sig, [count, first]] of sigs) {
    if (usual === null || count > sigs.get(usual)[0] ||
        (count === sigs.get(usual)[0] && first < sigs.get(usual)[1])) usual = sig;
  }
  let odd = -1;
  for (const [sig, [, first]] of sigs) if (sig !== usual && (odd < 0 || first < odd)) odd = first;
  return [nLo, nHi, dLo, dHi, flag, odd].filter((i) => i >= 0);
}

/** A row's kinds of reset, sorted and comma-joined (the server's reset_sig). */
function resetSig(resets) {
  return [...new Set((resets || []).map((r) => r.how))].sort().join(",");
}

/** Downsample a series in place by `keptRows`. Returns true when rows were dropped. */
export function compact(s, target) {
  const keep = keptRows(s, target);
  if (keep.length === s.length) return false;
  for (const c of COLUMNS) {
    const src = s[c];
    s[c] = keep.map((i) => src[i]);
  }
  return true;
}
