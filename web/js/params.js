/**
 * The per-parameter view: a heatmap of each parameter's drift (or norm) over steps, and a
 * table sortable by drift, filtered by optimizer and rank.
 *
 * Data comes from `GET /api/runs/{id}/params` (already downsampled server-side to a few
 * hundred steps), re-fetched on zoom and every few seconds while a run is live.
 */

import { fetchParams } from "./api.js";
import { el, fmt, labelsOf, plotText, plottable } from "./format.js";
import { whenPlotly } from "./loadplotly.js";

const HEAT_STEPS = 400;
const HOT_DRIFT = 1.5;

export class ParamsView {
  constructor({ heatmap, tbody, table, selOpt, selRank, selMetric }) {
    this.gd = heatmap;
    this.tbody = tbody;
    this.table = table;
    this.selOpt = selOpt;
    this.selRank = selRank;
    this.selMetric = selMetric;
    this.runId = null;
    this.optimizers = [];
    this.range = null;
    this.data = null;
    this.rows = [];
    this.sortKey = "drift";
    this.sortDir = -1;
    this.ready = null;
    this.abort = null;
    this.seq = 0;
    for (const s of [selOpt, selRank]) s.addEventListener("change", () => this.refresh());
    selMetric.addEventListener("change", () => this.draw());
    table.querySelectorAll("th[data-key]").forEach((th) => {
      th.addEventListener("click", () => this.sortBy(th.dataset.key));
    });
  }

  /** A run was opened (or its optimizers changed). */
  setRun(runId, optimizers, ranks) {
    const changed = runId !== this.runId;
    this.runId = runId;
    this.optimizers = optimizers;
    const labels = labelsOf(optimizers);
    const opts = [...new Set(optimizers.map((o) => o.opt))];
    fillSelect(this.selOpt, opts.map((o) => [o, labels.get(o) || o]),
      changed ? null : this.selOpt.value);
    const rankList = ranks && ranks.length ? ranks : [0];
    fillSelect(this.selRank, rankList.map((r) => [String(r), `rank ${r}`]),
      changed ? null : this.selRank.value);
    if (changed) {
      this.range = null;
      this.data = null;
    }
  }

  /** Show one optimizer (e.g. the one of a clicked finding). */
  selectOptimizer(opt, rank) {
    if ([...this.selOpt.options].some((o) => o.value === opt)) this.selOpt.value = opt;
    if ([...this.selRank.options].some((o) => o.value === String(rank))) {
      this.selRank.value = String(rank);
    }
  }

  setRange(range) {
    this.range = range;
  }

  async refresh() {
    if (!this.runId || !this.selOpt.value) return;
    if (this.abort) this.abort.abort();
    this.abort = new AbortController();
    const mySeq = ++this.seq;
    try {
      const data = await fetchParams(this.runId, {
        opt: this.selOpt.value, rank: this.selRank.value || 0,
        start: this.range ? Math.max(0, Math.floor(this.range[0])) : null,
        end: this.range ? Math.ceil(this.range[1]) : null,
        maxPoints: HEAT_STEPS, signal: this.abort.signal,
      });
      if (mySeq !== this.seq) return;
      this.data = data;
      this.draw();
    } catch (err) {
      if (err.name !== "AbortError") console.warn("gradwatch: parameter view", err);
    }
  }

  /** Per (param, step) values of a metric ("drift", "norm", "fresh"); rows = params. */
  matrix(metric) {
    const d = this.data;
    const nP = d.params.length, nS = d.step.length;
    const z = Array.from({ length: nP }, () => new Array(nS).fill(null));
    for (let j = 0; j < nS; j++) {
      const norms = d.norm[j] || [], fresh = (d.fresh_norm && d.fresh_norm[j]) || [];
      for (let p = 0; p < nP; p++) {
        const n = plottable(norms[p]), f = plottable(fresh[p]);
        if (metric === "drift") z[p][j] = n !== null && f ? n / f : null;
        else z[p][j] = metric === "norm" ? n : f;
      }
    }
    return z;
  }

  async draw() {
    if (!this.data) return;
    const d = this.data;
    const metric = this.selMetric.value;
    const raw = this.matrix(metric);
    const drift = metric === "drift" ? raw : this.matrix("drift");
    this.rows = d.params.map((name, p) => {
      const vals = drift[p].filter((v) => v !== null);
      const lastNorm = lastFinite(d.norm.map((row) => plottable((row || [])[p])));
      return {
        name,
        shape: this.shapeOf(d.opt, name),
        norm: lastNorm,
        drift: vals.length ? Math.max(...vals) : null,
        mean: vals.length ? vals.reduce((a, b) => a + b, 0) / vals.length : null,
      };
    });
    this.renderTable();
    const Plotly = await whenPlotly();
    const names = d.params.map((n) => plotText(n));
    const scale = colorScale(metric, raw);
    const trace = {
      type: "heatmap", x: d.step, y: names.map((_, i) => i), z: scale.z, customdata: raw,
      text: names.map((n) => d.step.map(() => n)),
      colorscale: scale.colors, zmin: scale.zmin, zmax: scale.zmax,
      hovertemplate: `%{text}<br>step %{x}<br>${metric === "fresh" ? "fresh norm" : metric}` +
        " %{customdata:.4g}<extra></extra>",
      colorbar: { thickness: 10, tickfont: { color: "#8b96a3", size: 10 }, outlinewidth: 0,
        tickvals: scale.ticks.map((t) => t[0]), ticktext: scale.ticks.map((t) => t[1]),
        title: { text: metric === "drift" ? "drift" : `${metric === "fresh" ? "fresh " : ""}norm`,
          font: { color: "#8b96a3", size: 10 }, side: "right" } },
      xgap: 0, ygap: d.params.length < 40 ? 1 : 0,
    };
    const showNames = d.params.length <= 30;
    const layout = {
      paper_bgcolor: "#161b22", plot_bgcolor: "#161b22",
      font: { color: "#d8dee6", size: 11 },
      margin: { l: showNames ? 150 : 40, r: 10, t: 8, b: 32 },
      xaxis: { gridcolor: "#2a323d", tickfont: { color: "#8b96a3" }, zeroline: false },
      yaxis: { autorange: "reversed", zeroline: false, showgrid: false, tickfont: { color: "#8b96a3", size: 10 },
        tickvals: showNames ? names.map((_, i) => i) : undefined,
        ticktext: showNames ? d.params.map((n) => plotText(truncate(n, 24))) : undefined,
        showticklabels: showNames, title: showNames ? undefined : { text: "parameter" } },
      uirevision: `${this.runId}|${d.opt}|${d.rank}|${metric}`,
    };
    const config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["toImage", "select2d", "lasso2d"] };
    if (!this.ready) this.ready = Plotly.newPlot(this.gd, [trace], layout, config);
    else this.ready = this.ready.then(() => Plotly.react(this.gd, [trace], layout, config));
    await this.ready;
  }

  shapeOf(opt, name) {
    const view = this.optimizers.find((o) => o.opt === opt && String(o.rank) === this.selRank.value) ||
      this.optimizers.find((o) => o.opt === opt);
    if (!view || !view.shapes) return "";
    const i = view.params.indexOf(name);
    return i >= 0 && view.shapes[i] ? `[${view.shapes[i].join("×")}]` : "";
  }

  sortBy(key) {
    if (this.sortKey === key) this.sortDir = -this.sortDir;
    else {
      this.sortKey = key;
      this.sortDir = key === "name" || key === "shape" ? 1 : -1;
    }
    this.renderTable();
  }

  renderTable() {
    const k = this.sortKey, dir = this.sortDir;
    const rows = [...this.rows].sort((a, b) => {
      const x = a[k], y = b[k];
      if (x === y) return 0;
      if (x === null || x === "") return 1;
      if (y === null || y === "") return -1;
      return (x < y ? -1 : 1) * dir;
    });
    this.table.querySelectorAll("th[data-key]").forEach((th) => {
      if (th.dataset.key === k) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    });
    this.tbody.replaceChildren(...rows.map((r) => {
      const tr = el("tr", { class: r.drift !== null && r.drift > HOT_DRIFT ? "hot" : null });
      tr.append(
        el("td", { title: r.name }, r.name),
        el("td", {}, r.shape),
        el("td", { class: "num" }, fmt(r.norm)),
        el("td", { class: "num" }, fmt(r.drift)),
        el("td", { class: "num" }, fmt(r.mean)),
      );
      return tr;
    }));
  }

  clear() {
    this.data = null;
    this.rows = [];
    this.tbody.replaceChildren();
    if (this.abort) this.abort.abort();
    if (this.ready && window.Plotly) window.Plotly.purge(this.gd);
    this.ready = null;
  }
}

function fillSelect(sel, items, keep) {
  const current = keep ?? (items[0] && items[0][0]);
  sel.replaceChildren(...items.map(([value, label]) => el("option", { value }, label)));
  if (items.some(([v]) => v === current)) sel.value = current;
  sel.hidden = items.length <= 1 && sel.id === "sel-rank";
}

/**
 * The heatmap's colours on a log10 scale from the smallest to the largest value there is,
 * so small values stay apart and the top of the bar is the table's maximum (labelled as
 * such). Drift is diverging at 1.0 (healthy, dark): above it warms to amber and red, below
 * it (a reset threw the fresh gradient away) turns blue. Norms use Viridis.
 */
function colorScale(metric, raw) {
  let lo = Infinity, hi = -Infinity;
  for (const row of raw) {
    for (const v of row) {
      if (v !== null && v > 0 && Number.isFinite(v)) {
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
  }
  const z = raw.map((row) => row.map((v) => (v !== null && v > 0 ? Math.log10(v) : null)));
  if (!(lo <= hi)) return { z, colors: "Viridis", zmin: 0, zmax: 1, ticks: [] };
  let zmin = Math.log10(lo), zmax = Math.log10(hi);
  let colors = "Viridis";
  if (metric === "drift") {
    zmin = Math.min(zmin, -0.05);
    zmax = Math.max(zmax, Math.log10(2));
    const at = (v) => (Math.log10(v) - zmin) / (zmax - zmin);
    colors = [[0, "#3d7cc9"], [at(1), "#1b2430"], [at(1.5), "#e3a13b"], [1, "#f26d6d"]];
    if (at(10) < 0.97 && at(10) > at(1.5)) colors.splice(3, 0, [at(10), "#f0803c"]);
  } else if (zmax - zmin < 1e-9) {
    zmin -= 0.5;
    zmax += 0.5;
  }
  return { z, colors, zmin, zmax, ticks: logTicks(zmin, zmax, hi) };
}

/** Colour-bar ticks [log10 value, label]: 1-2-5 steps inside the range, and the max. */
function logTicks(zmin, zmax, max) {
  const out = [];
  for (let e = Math.floor(zmin); e <= Math.ceil(zmax); e++) {
    for (const m of zmax - zmin > 3 ? [1] : [1, 2, 5]) {
      const v = m * 10 ** e, lv = Math.log10(v);
      if (lv >= zmin && lv <= zmax - 0.08 * (zmax - zmin)) out.push([lv, fmt(v)]);
    }
  }
  out.push([Math.log10(max), `max ${fmt(max)}`]);
  return out;
}

function lastFinite(arr) {
  for (let i = arr.length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i];
  return null;
}

function truncate(s, n) {
  return s.length > n ? `…${s.slice(-(n - 1))}` : s;
}
