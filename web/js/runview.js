/**
 * One open run: wires the run's live socket to the main chart, the findings panel, the
 * per-parameter view and the player, and owns follow-live, pause and zoom state.
 */

import { downloadExport, fetchSteps } from "./api.js";
import { MainChart } from "./charts.js";
import { FindingsPanel } from "./findings.js";
import { count, fmt, setText } from "./format.js";
import { ParamsView } from "./params.js";
import { Player } from "./player.js";
import { appendRows, ingest } from "./series.js";
import { renderSummary, showToast } from "./summary.js";
import { LiveSocket } from "./socket.js";

const $ = (id) => document.getElementById(id);
const PARAMS_REFRESH_MS = 3000;

/** Rows per series to ask for: about two per horizontal pixel of the chart. */
function maxPoints() {
  const w = $("chart").clientWidth || 1200;
  return Math.max(500, Math.min(8000, Math.round(w * 2)));
}

export class RunView {
  /**
   * @param {string} runId
   * @param {(state: object) => void} onSocketState
   */
  constructor(runId, onSocketState) {
    this.runId = runId;
    this.summary = null;
    this.optimizers = [];
    this.series = new Map();
    this.findings = [];
    this.range = null; // null = whole run
    this.fetchSeq = 0;
    this.paramsTimer = null;
    this.cursorBusy = false;
    this.cursorNext = null;
    freshControls();
    this.chart = new MainChart($("chart"), { onRange: (r, byUser) => this.onRange(r, byUser) },
      $("legend"));
    this.findingsPanel = new FindingsPanel($("findings"), (f) => this.pickFinding(f));
    this.params = new ParamsView({
      heatmap: $("heatmap"), tbody: $("params-body"), table: $("params-table"),
      selOpt: $("sel-opt"), selRank: $("sel-rank"), selMetric: $("sel-metric"),
    });
    this.player = new Player({
      root: $("player"), play: $("btn-play"), speed: $("sel-speed"), slider: $("slider"),
      readout: $("readout"),
    }, (step) => this.showStep(step));
    this.bindToolbar();
    this.resetDom();
    this.socket = new LiveSocket("/ws/live", { run: runId, max_points: maxPoints() }, {
      snapshot: (f) => this.onSnapshot(f),
      steps: (f) => this.onSteps(f),
      findings: (f) => this.setFindings(f.findings || []),
      run: (f) => this.setSummary(f.run),
      optimizer: (f) => this.onOptimizer(f.optimizer),
      error: (f) => showToast(f.detail || f.message || "server error"),
      gone: () => showToast(`The server has no run '${runId}' (yet); retrying.`),
    }, onSocketState);
  }

  resetDom() {
    $("welcome").hidden = true;
    $("run").hidden = false;
    setText("run-name", this.runId);
    setText("run-status", "");
    $("run-facts").replaceChildren();
    $("run-dropped").hidden = true;
    this.findingsPanel.set([]);
    setText("sampling", "");
  }

  bindToolbar() {
    $("btn-follow").addEventListener("click", () => this.setFollow(!this.chart.follow));
    $("btn-pause").addEventListener("click", () => this.setPaused(!this.chart.paused));
    $("btn-reset").addEventListener("click", () => this.onRange(null, true));
    $("chk-log").checked = false;
    $("chk-log").addEventListener("change", (ev) => this.chart.setLogScale(ev.target.checked));
    $("btn-png").addEventListener("click", () =>
      this.chart.downloadPng(`gradwatch-${this.runId}`).catch((e) => showToast(String(e))));
    for (const [id, fmtName] of [["btn-csv", "csv"], ["btn-jsonl", "jsonl"]]) {
      $(id).addEventListener("click", () =>
        downloadExport(this.runId, fmtName).catch((e) => showToast(`Export failed: ${e.message}`)));
    }
    this.setPaused(false);
    this.setFollowButton(true);
  }

  get live() {
    return this.summary ? this.summary.status === "live" : true;
  }

  // ---- socket frames -------------------------------------------------------------------

  async onSnapshot(f) {
    performance.mark("gradwatch:snapshot");
    this.setSummary(f.run);
    this.optimizers = f.optimizers || [];
    this.params.setRun(this.runId, this.optimizers, f.run && f.run.ranks);
    this.series = new Map();
    ingest(f.steps, this.series);
    this.setSampling(f.steps);
    this.setFindings(f.findings || []);
    if (this.range) {
      // Reconnected while zoomed: keep the user's window.
      await this.chart.load(this.series, this.range);
      this.refetch();
    } else {
      await this.chart.load(this.series, null);
    }
    this.updatePlayer();
    this.params.setRange(this.range);
    this.params.refresh();
    this.scheduleParams();
    document.body.dataset.snapshot = String(Number(document.body.dataset.snapshot || 0) + 1);
  }

  onSteps(f) {
    const { added, created } = ingest(f.steps, this.series);
    if (added.size || created.length) this.chart.append(added, created);
  }

  onOptimizer(view) {
    if (!view) return;
    this.optimizers = [...this.optimizers.filter((o) => !(o.opt === view.opt && o.rank === view.rank)), view];
    this.params.setRun(this.runId, this.optimizers, this.summary && this.summary.ranks);
    if (!this.params.data) this.params.refresh();
  }

  setFindings(findings) {
    this.findings = findings;
    this.findingsPanel.set(findings);
    this.chart.setFindings(findings);
  }

  setSummary(run) {
    if (!run) return;
    const wasLive = this.live;
    this.summary = run;
    renderSummary(run);
    if (wasLive && !this.live) {
      // The run ended: its last steps are in; show the player and final parameter view.
      this.updatePlayer();
      this.params.refresh();
    }
    $("btn-follow").disabled = !this.live;
    if (!this.live) this.setFollowButton(false);
  }

  setSampling(ss) {
    if (!ss) return;
    const text = ss.downsampled
      ? `showing ${count(ss.step.length)} of ${count(ss.total)} rows (min/max per ${count(ss.bucket)} steps)`
      : "";
    setText("sampling", text);
  }

  // ---- follow, pause, zoom ---------------------------------------------------------------

  setFollowButton(on) {
    $("btn-follow").setAttribute("aria-pressed", String(on));
  }

  setFollow(on) {
    this.chart.follow = on;
    this.setFollowButton(on);
    if (on) this.onRange(null, false);
  }

  setPaused(paused) {
    this.chart.setPaused(paused);
    const b = $("btn-pause");
    b.setAttribute("aria-pressed", String(paused));
    b.textContent = paused ? "Resume" : "Pause";
  }

  /** The step axis changed: null = whole run. Re-fetch the window, downsampled server-side. */
  onRange(range, byUser) {
    this.range = range;
    if (byUser && range) {
      this.chart.follow = false;
      this.setFollowButton(false);
    } else if (!range && this.live) {
      this.chart.follow = true;
      this.setFollowButton(true);
    }
    this.params.setRange(range);
    clearTimeout(this.rangeTimer);
    this.rangeTimer = setTimeout(() => {
      this.refetch();
      this.params.refresh();
    }, 120);
  }

  async refetch() {
    const seq = ++this.fetchSeq;
    const range = this.range;
    try {
      const ss = await fetchSteps(this.runId, {
        start: range ? Math.max(0, Math.floor(range[0])) : null,
        end: range ? Math.ceil(range[1]) : null,
        maxPoints: maxPoints(),
      });
      if (seq !== this.fetchSeq) return;
      const fresh = new Map();
      ingest(ss, fresh);
      // Rows that arrived live after this fetch was answered are kept.
      for (const [key, s] of this.series) {
        const f = fresh.get(key);
        if (!f || range) continue;
        for (let i = 0; i < s.length; i++) {
          if (s.step[i] > f.lastStep) {
            appendRows(s, i, fresh);
            break;
          }
        }
      }
      this.series = fresh;
      this.setSampling(ss);
      await this.chart.load(this.series, range);
    } catch (err) {
      showToast(`Could not load steps: ${err.message}`);
    }
  }

  pickFinding(f) {
    const span = Math.max(1, f.last_step - f.first_step);
    const pad = Math.max(5, Math.round(span * 0.25));
    this.chart.zoomTo(Math.max(0, f.first_step - pad), f.last_step + pad);
    // Findings name an optimizer by its label where it has one; the selector lists ids.
    const info = this.optimizers.find((o) => o.label === f.optimizer && (o.rank || 0) === (f.rank || 0));
    this.params.selectOptimizer(info ? info.opt : f.optimizer, f.rank || 0);
    if (!this.live) this.player.seek(f.first_step);
  }

  // ---- stored-run player ------------------------------------------------------------------

  primary() {
    return this.series.values().next().value;
  }

  updatePlayer() {
    const s = this.primary();
    if (this.live || !s || !s.length) {
      this.player.setup(false);
      return;
    }
    let min = Infinity, max = -Infinity;
    for (const x of this.series.values()) {
      if (x.length) {
        min = Math.min(min, x.step[0]);
        max = Math.max(max, x.lastStep);
      }
    }
    if (this.range) {
      min = Math.min(min, Math.floor(this.range[0]));
      max = Math.max(max, Math.ceil(this.range[1]));
    }
    this.player.setup(true, min, Math.max(min, this.summary ? Math.max(max, 0) : max));
    this.showStep(Number($("slider").value));
  }

  /** Cursor and readout at a step (coalesced: at most one redraw in flight). */
  async showStep(step) {
    const parts = [`step ${count(step)}`];
    for (const s of this.series.values()) {
      const i = s.nearest(step);
      if (i < 0) continue;
      const label = this.series.size > 1 ? `${s.opt}: ` : "";
      const resets = (s.resets[i] || []).map((r) => r.how).join("+") || "no reset";
      parts.push(`${label}‖g‖ ${fmt(s.norm[i])} fresh ${fmt(s.fresh[i])} drift ${fmt(s.drift[i])}` +
        `${s.stale[i] ? ` stale ${s.stale[i]}` : ""} · ${resets}`);
    }
    setText("readout", parts.join("  |  "));
    this.cursorNext = step;
    if (this.cursorBusy) return;
    this.cursorBusy = true;
    try {
      while (this.cursorNext !== null) {
        const s = this.cursorNext;
        this.cursorNext = null;
        await this.chart.setCursor(s);
      }
    } finally {
      this.cursorBusy = false;
    }
  }

  // ---- parameter view refresh ---------------------------------------------------------------

  scheduleParams() {
    clearTimeout(this.paramsTimer);
    this.paramsTimer = setTimeout(() => {
      if (this.live && !this.chart.paused && !document.hidden && !this.range) this.params.refresh();
      this.scheduleParams();
    }, PARAMS_REFRESH_MS);
  }

  /** Leave the run: close its socket and release the figures. */
  destroy() {
    this.socket.close();
    clearTimeout(this.paramsTimer);
    clearTimeout(this.rangeTimer);
    this.player.stop();
    this.chart.destroy();
    this.params.clear();
  }
}

/**
 * Swap the run view's controls for clones, dropping the listeners a previous run view
 * attached, so an old view's handlers never fire for a new run.
 */
function freshControls() {
  const ids = ["btn-follow", "btn-pause", "btn-reset", "btn-png", "btn-csv", "btn-jsonl", "chk-log",
    "btn-play", "sel-speed", "slider", "sel-opt", "sel-rank", "sel-metric"];
  for (const id of ids) {
    const old = $(id);
    old.replaceWith(old.cloneNode(true));
  }
  const thead = $("params-table").tHead;
  thead.replaceWith(thead.cloneNode(true));
}
