/**
 * Runs side by side: two or more runs' ‖grad‖, drift and loss overlaid on one step axis, each
 * run's verdict in a row above the chart. Each run keeps its own live socket, so a run
 * still training keeps drawing; zooming re-fetches every run's window.
 */

import { CompareChart, RUN_COLORS } from "./comparechart.js";
import { downloadFigure, exportFigure, fileStem } from "./exporting.js";
import { count, el, setText, stepRange } from "./format.js";
import { findingKind, primaryWhere, whereAt } from "./kinds.js";
import { showToast } from "./notices.js";
import { ingest } from "./series.js";
import { LiveSocket } from "./socket.js";
import { loadWindow, maxPoints } from "./stepwindow.js";
import { updateState, viewHref } from "./urlstate.js";

const $ = (id) => document.getElementById(id);
const RANK = { closed: 3, connecting: 2, gone: 1, open: 0 };

export class CompareView {
  /**
   * @param {string[]} ids the runs, in the order of their colours
   * @param {(state: object) => void} onSocketState the worst state of the runs' sockets
   * @param {{range: number[]|null, log: boolean}} initial from the URL
   * @param {{open: (id: string) => void, compare: (ids: string[]) => void}} go navigation
   */
  constructor(ids, onSocketState, initial, go) {
    this.ids = ids;
    this.key = `compare:${ids.join(",")}`;
    this.go = go;
    this.range = initial.range;
    this.onSocketState = onSocketState;
    this.fetchSeq = 0;
    this.drawTimer = 0;
    for (const id of ["cmp-log", "cmp-reset", "cmp-png"]) {
      const old = $(id);
      old.replaceWith(old.cloneNode(true));
    }
    this.chart = new CompareChart($("compare-chart"), { onRange: (r) => this.onRange(r) },
      $("compare-legend"));
    this.chart.logScale = initial.log;
    $("cmp-log").checked = initial.log;
    $("cmp-log").addEventListener("change", (ev) => {
      this.chart.setLogScale(ev.target.checked);
      updateState({ log: ev.target.checked });
    });
    $("cmp-reset").addEventListener("click", () => this.chart.zoomOut());
    $("cmp-png").addEventListener("click", () => this.downloadPng().catch((e) => showToast(String(e))));
    for (const v of ["welcome", "run", "missing"]) $(v).hidden = true;
    $("compare").hidden = false;
    this.entries = new Map(ids.map((id, i) => [id, {
      id, color: RUN_COLORS[i % RUN_COLORS.length], summary: null, series: new Map(),
      findings: [], state: "connecting", missing: false,
    }]));
    this.renderRows();
    for (const e of this.entries.values()) {
      e.socket = new LiveSocket("/ws/live", { run: e.id, max_points: maxPoints($("compare-chart")) }, {
        snapshot: (f) => this.onSnapshot(e, f),
        steps: (f) => this.onSteps(e, f),
        findings: (f) => { e.findings = f.findings || []; this.renderRows(); },
        run: (f) => this.onSummary(e, f.run),
        deleted: () => this.setMissing(e),
        gone: () => this.setMissing(e),
      }, (s) => this.onState(e, s));
    }
  }

  onState(e, s) {
    e.state = s.state;
    const worst = [...this.entries.values()].reduce((a, x) => (RANK[x.state] > RANK[a.state] ? x : a));
    this.onSocketState({ state: worst.state, reason: s.reason, retryIn: s.retryIn });
  }

  setMissing(e) {
    e.missing = true;
    e.series = new Map();
    this.renderRows();
  }

  onSnapshot(e, f) {
    e.missing = false;
    e.summary = f.run;
    e.findings = f.findings || [];
    e.series = new Map();
    ingest(f.steps, e.series);
    this.renderRows();
    this.chart.setRun(e.id, this.name(e), e.series, e.color);
    // Snapshots of all runs come in together: draw once for them all.
    clearTimeout(this.drawTimer);
    this.drawTimer = setTimeout(() => (this.range ? this.refetch() : this.chart.draw(null)), 30);
  }

  onSummary(e, run) {
    const renamed = e.summary && run && e.summary.name !== run.name;
    e.summary = run;
    this.renderRows();
    if (renamed && this.chart.runs.has(e.id)) {
      this.chart.setRun(e.id, this.name(e), e.series, e.color);
      this.chart.redraw();
    }
  }

  onSteps(e, f) {
    if (!this.chart.runs.has(e.id)) return;
    const { added, created } = ingest(f.steps, e.series);
    if (added.size || created.length) this.chart.appendRun(e.id, added, created);
  }

  name(e) {
    return e.summary ? e.summary.name || e.id : e.id;
  }

  /** One row per run: colour, name (a link to the run), status, steps and its verdict. */
  renderRows() {
    const ready = [...this.entries.values()].filter((e) => e.summary);
    setText("compare-title", `Comparing ${count(this.ids.length)} runs`);
    document.title = `${ready.map((e) => this.name(e)).join(" vs ") || "Compare"} · gradwatch`;
    $("compare-runs").replaceChildren(...[...this.entries.values()].map((e) => {
      const tr = el("tr", { dataset: { run: e.id } });
      const sw = el("span", { class: "sw-run" });
      sw.style.background = e.color;
      const link = el("a", { href: viewHref({ run: e.id }) }, this.name(e));
      link.addEventListener("click", (ev) => {
        if (ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
        ev.preventDefault();
        this.go.open(e.id);
      });
      const badge = el("span", { class: "badge", dataset: { status: e.summary ? e.summary.status : "" } },
        e.missing ? "not found" : e.summary ? e.summary.status : "…");
      const remove = el("button", { type: "button", class: "act", title: "Remove from the comparison",
        "aria-label": `Remove ${this.name(e)} from the comparison` }, "×");
      remove.addEventListener("click", () => this.go.compare(this.ids.filter((id) => id !== e.id)));
      const cells = [sw, link, badge, e.summary ? count(e.summary.steps) : "–", this.verdictText(e), remove];
      tr.append(...cells.map((c, i) => {
        const td = el("td", { class: i === 3 ? "num" : i === 4 ? "v" : null });
        td.append(typeof c === "string" ? document.createTextNode(c) : c);
        return td;
      }));
      return tr;
    }));
  }

  verdictText(e) {
    if (e.missing) return "no such run on this server";
    if (!e.summary) return "loading…";
    if (!e.findings.length) return e.summary.status === "live" ? "no findings so far" : "clean";
    return e.findings.map((f) => {
      const w = primaryWhere(f);
      return `${findingKind(f.kind).label} ${stepRange(f.first_step, f.last_step)}${w ? ` (${whereAt(w)})` : ""}`;
    }).join("; ");
  }

  onRange(range) {
    this.range = range;
    updateState({ zoom: range });
    clearTimeout(this.rangeTimer);
    this.rangeTimer = setTimeout(() => this.refetch(), 120);
  }

  /** Every run's rows in the window, then one redraw. */
  async refetch() {
    const seq = ++this.fetchSeq;
    const range = this.range;
    const live = [...this.entries.values()].filter((e) => this.chart.runs.has(e.id));
    try {
      const got = await Promise.all(live.map((e) =>
        loadWindow(e.id, range, e.series, maxPoints($("compare-chart")))));
      if (seq !== this.fetchSeq) return;
      live.forEach((e, i) => {
        e.series = got[i].series;
        this.chart.setRun(e.id, this.name(e), e.series, e.color);
      });
      await this.chart.draw(range);
    } catch (err) {
      showToast(`Could not load steps: ${err.message}`);
    }
  }

  async downloadPng() {
    await this.chart.ready;
    const names = [...this.entries.values()].map((e) => this.name(e));
    const figure = exportFigure($("compare-chart"), {
      title: `Compare: ${names.join(" vs ")}`,
      subtitle: `runs ${this.ids.join(", ")}`,
    });
    await downloadFigure(figure, `compare-${this.ids.map((id) => fileStem("", id)).join("-")}`);
  }

  destroy() {
    clearTimeout(this.drawTimer);
    clearTimeout(this.rangeTimer);
    for (const e of this.entries.values()) e.socket.close();
    this.chart.destroy();
  }
}
