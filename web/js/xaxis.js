/**
 * What the run chart's x axis counts: optimizer steps, time since the first step, or the
 * wall clock (TensorBoard's STEP / RELATIVE / WALL). Steps stay the chart's own unit (zoom
 * windows, finding bands, the player's cursor, the URL): an XAxis maps a series' steps to
 * x values and back through the time each step record carries (`Step.t`).
 */

export const X_MODES = ["step", "relative", "wall"];

/** Local wall-clock time as plotly's (UTC) date axis shows it: ms, shifted by the zone. */
function wallMs(t) {
  const ms = t * 1000;
  return ms - new Date(ms).getTimezoneOffset() * 60000;
}

/** The time (Unix seconds) of fractional step `x` on series `s`, interpolated. */
function timeAt(s, x) {
  const n = s.length;
  if (!n) return null;
  if (n === 1 || x <= s.step[0]) return s.t[0] + (n > 1 ? (x - s.step[0]) * rate(s, 0) : 0);
  if (x >= s.step[n - 1]) return s.t[n - 1] + (x - s.step[n - 1]) * rate(s, n - 2);
  let lo = 0, hi = n - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (s.step[mid] <= x) lo = mid;
    else hi = mid;
  }
  return s.t[lo] + (x - s.step[lo]) * rate(s, lo);
}

/** Seconds per step between rows i and i + 1. */
function rate(s, i) {
  const ds = s.step[i + 1] - s.step[i];
  return ds > 0 ? (s.t[i + 1] - s.t[i]) / ds : 0;
}

/** The fractional step of series `s` at time `t`, interpolated (times never decrease). */
function stepAt(s, t) {
  const n = s.length;
  if (!n) return null;
  let lo = 0, hi = n - 1;
  if (t <= s.t[0]) hi = Math.min(1, n - 1);
  else if (t >= s.t[n - 1]) lo = Math.max(0, n - 2);
  else {
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (s.t[mid] <= t) lo = mid;
      else hi = mid;
    }
  }
  const dt = s.t[hi] - s.t[lo];
  return dt > 0 ? s.step[lo] + ((t - s.t[lo]) / dt) * (s.step[hi] - s.step[lo]) : s.step[lo];
}

export class XAxis {
  /**
   * @param {string} mode one of X_MODES
   * @param {Iterable<object>} series the chart's Series (steps and times)
   */
  constructor(mode, series) {
    this.mode = X_MODES.includes(mode) ? mode : "step";
    const list = [...series].filter((s) => s.length);
    this.primary = list[0] || null;
    this.t0 = Math.min(...list.map((s) => s.t[0]));
    const span = Math.max(0, ...list.map((s) => s.t[s.length - 1] - this.t0));
    // Hours once a run is longer than two, so tick labels stay short.
    this.unit = span > 7200 ? 3600 : 1;
  }

  get isStep() {
    return this.mode === "step" || !this.primary;
  }

  /** The x value of time `t`. */
  ofTime(t) {
    if (t === null || t === undefined) return null;
    return this.mode === "wall" ? wallMs(t) : (t - this.t0) / this.unit;
  }

  /** The time of x value `x`. */
  timeOf(x) {
    if (this.mode === "wall") return (x + new Date(x).getTimezoneOffset() * 60000) / 1000;
    return x * this.unit + this.t0;
  }

  /** The x values of rows [from, end) of series `s`. */
  rowsX(s, from = 0) {
    if (this.isStep) return s.step.slice(from);
    return s.t.slice(from).map((t) => this.ofTime(t));
  }

  /** The x value of (fractional) step `x` of series `s` (default: the primary one). */
  ofStep(x, s = this.primary) {
    if (this.isStep || x === null || !s || !s.length) return x;
    return this.ofTime(timeAt(s, x));
  }

  /** The (fractional) step of the primary series at x value `x`. */
  stepOf(x) {
    if (this.isStep || x === null) return x;
    return stepAt(this.primary, this.timeOf(x));
  }

  /** A step window [a, b] as x values, and back. */
  toX(range) {
    return range && !this.isStep ? range.map((v) => this.ofStep(v)) : range;
  }

  fromX(range) {
    return range && !this.isStep ? range.map((v) => this.stepOf(v)) : range;
  }

  /** Set the layout's x axis for this mode: its type and title. */
  style(layout) {
    if (this.isStep) return;
    const ax = layout.xaxis;
    if (this.mode === "wall") {
      ax.type = "date";
      ax.title.text = "wall-clock time";
    } else {
      ax.type = "linear";
      ax.title.text = `time since the first step (${this.unit === 1 ? "s" : "h"})`;
    }
    if (ax.range) ax.range = this.toX(ax.range);
  }
}
