/**
 * One open run: wires the run's live socket to the verdict, the main chart, the per-parameter
 * view and the player; owns follow-live, freeze and zoom state and keeps it in the URL.
 */

import { downloadExport, fetchRun, fetchScalars } from "./api.js";
import { MainChart } from "./charts.js";
import { renderConfig } from "./config.js";
import { downloadFigure, fileStem, runFigure } from "./exporting.js";
import { count, labelsOf, optName, setText } from "./format.js";
import { Announcer, showToast } from "./notices.js";
import { ParamsView } from "./params.js";
import { RunNotes } from "./runnotes.js";
import { Player } from "./player.js";
import { ingest } from "./series.js";
import { LiveSocket } from "./socket.js";
import { loadWindow, maxPoints, readoutText } from "./stepwindow.js";
import { clearSummary, renderMissing, renderSampling, renderSummary } from "./summary.js";
import { updateState } from "./urlstate.js";
import { VerdictPanel, findingKey } from "./verdict.js";

const $ = (id) => document.getElementById(id);
const PARAMS_REFRESH_MS = 3000;

export class RunView {
  /**
   * @param {string} runId
   * @param {(state: object) => void} onSocketState
   * @param {{range: number[]|null, finding: string|null, log: boolean, smooth: number,
   *   norms: string}} initial from the URL
   */
  constructor(runId, onSocketState, initial) {
    this.runId = runId;
    this.summary = null;
    this.optimizers = [];
    this.series = new Map();
    this.range = initial.range;
    this.follow = !initial.range;
    this.findingKey = initial.finding;
    this.landOn = null; // a step to show once its window is loaded
    this.restored = false; // the finding in the URL was selected (first snapshot)
    this.held = 0; // steps received while the chart is frozen
    this.fetchSeq = 0;
    this.paramsTimer = null;
    this.cursorBusy = false;
    this.cursorNext = null;
    freshControls();
    this.chart = new MainChart($("chart"), { onRange: (r) => this.onRange(r) }, $("legend"));
    this.chart.logScale = initial.log;
    $("chk-log").checked = initial.log;
    this.chart.smoothing = initial.smooth || 0;
    this.chart.xmode = initial.x || "step";
    $("sel-x").value = this.chart.xmode;
    $("rng-smooth").value = String(this.chart.smoothing);
    setText("smooth-val", this.chart.smoothing.toFixed(2));
    this.verdict = new VerdictPanel($("findings"), (f) => this.pickFinding(f));
    this.announcer = new Announcer($("notices"), (f) => this.verdict.pick(f));
    this.params = new ParamsView({
      heatmap: $("heatmap"), tbody: $("params-body"), table: $("params-table"),
      selOpt: $("sel-opt"), selRank: $("sel-rank"), selMetric: $("sel-metric"),
    });
    this.player = new Player({
      root: $("player"), play: $("btn-play"), speed: $("sel-speed"), slider: $("slider"),
      readout: $("readout"),
    }, (step) => this.showStep(step));
    this.norms = initial.norms || "model";
    $("sel-norms").value = this.norms;
    $("sel-norms").hidden = true; // until the run's optimizers say it has sharded ones
    this.onSocketState = onSocketState;
    this.bindToolbar();
    this.notes = new RunNotes(runId);
    this.resetDom();
    this.openSocket();
  }

  /** The run's live socket: a snapshot, then live frames, in the norms chosen. */
  openSocket() {
    const runId = this.runId;
    this.socket = new LiveSocket("/ws/live", {
      run: runId, max_points: maxPoints($("chart")), norms: this.norms === "rank" ? "rank" : null,
    }, {
      snapshot: (f) => this.onSnapshot(f),
      steps: (f) => this.onSteps(f),
      scalars: (f) => this.chart.addScalars(f.scalars),
      findings: (f) => this.setFindings(f.findings || []),
      run: (f) => this.setSummary(f.run),
      optimizer: (f) => this.onOptimizer(f.optimizer),
      deleted: () => this.showMissing(true),
      error: (f) => showToast(f.detail || f.message || "server error"),
      gone: () => this.showMissing(false),
    }, this.onSocketState);
  }

  /**
   * Show a sharded run's norms as the model's or each rank's: the socket starts again in
   * those norms (a fresh snapshot), the zoom and the selection are kept.
   */
  setNorms(norms) {
    if (norms === this.norms) return;
    this.norms = norms;
    updateState({ norms: norms === "rank" ? "rank" : null });
    this.socket.close();
    this.openSocket();
  }

  resetDom() {
    for (const v of ["welcome", "compare", "missing"]) $(v).hidden = true;
    $("run").hidden = false;
    clearSummary(this.runId);
    $("run-config").hidden = true;
    this.verdict.set([]);
    this.verdict.setSummary(null);
  }

  /** The server holds no such run (or it was just deleted). */
  showMissing(deleted) {
    renderMissing(this.runId, deleted);
  }

  bindToolbar() {
    $("btn-follow").addEventListener("click", () => this.toggleFollow());
    $("btn-freeze").addEventListener("click", () => this.setFrozen(!this.chart.paused));
    $("btn-reset").addEventListener("click", () => this.chart.zoomOut());
    $("chk-log").addEventListener("change", (ev) => {
      this.chart.setLogScale(ev.target.checked);
      updateState({ log: ev.target.checked });
    });
    $("sel-norms").addEventListener("change", (ev) => this.setNorms(ev.target.value));
    $("sel-x").addEventListener("change", (ev) => {
      this.chart.setXMode(ev.target.value);
      updateState({ x: ev.target.value === "step" ? null : ev.target.value });
    });
    $("rng-smooth").addEventListener("input", (ev) => {
      const w = Number(ev.target.value);
      setText("smooth-val", w.toFixed(2));
      updateState({ smooth: w > 0 ? w : null });
      // Dragging fires many inputs: redraw for the latest once per frame.
      cancelAnimationFrame(this.smoothFrame);
      this.smoothFrame = requestAnimationFrame(() => this.chart.setSmoothing(w));
    });
    $("btn-png").addEventListener("click", () => this.downloadPng().catch((e) => showToast(String(e))));
    for (const [id, ext] of [["btn-csv", "csv"], ["btn-jsonl", "jsonl"]]) {
      $(id).addEventListener("click", () => downloadExport(this.runId, ext, `${this.stem()}.${ext}`)
        .catch((e) => showToast(`Export failed: ${e.message}`)));
    }
    this.setFrozen(false);
    this.setFollowButton();
  }

  get live() {
    return this.summary ? this.summary.status === "live" : true;
  }

  // ---- socket frames -------------------------------------------------------------------

  async onSnapshot(f) {
    performance.mark("gradwatch:snapshot");
    $("missing").hidden = true;
    $("run").hidden = false;
    this.optimizers = f.optimizers || [];
    this.chart.optLabels = labelsOf(this.optimizers); // (the header names them too)
    this.setSummary(f.run);
    this.params.setRun(this.runId, this.optimizers, f.run && f.run.ranks);
    this.showConfig();
    showNormsChoice(this.optimizers);
    this.chart.optName = oneName(this.optimizers);
    this.series = new Map();
    ingest(f.steps, this.series);
    renderSampling(f.steps);
    this.setFindings(f.findings || []);
    const first = !this.restored;
    this.restored = true;
    if (first && this.findingKey) this.restoreFinding();
    await this.chart.load(this.series, this.range);
    // Values the user logged: few, fetched whole; live `scalars` frames add to them.
    fetchScalars(this.runId).then((sc) => this.chart.addScalars(sc))
      .catch((e) => console.warn("gradwatch: logged values not loaded", e));
    // Zoomed (a reconnect, or a link with a window): fetch the window in full detail; the
    // selected finding's step is shown once it is in.
    if (this.range) this.refetch();
    else this.land();
    this.updatePlayer();
    this.params.setRange(this.range);
    this.params.refresh();
    this.scheduleParams();
    document.body.dataset.snapshot = String(Number(document.body.dataset.snapshot || 0) + 1);
  }

  onSteps(f) {
    const { added, created } = ingest(f.steps, this.series);
    if (this.chart.paused) {
      for (const { series, from } of added.values()) this.held += series.length - from;
      this.setFrozen(true);
    }
    if (added.size || created.length) this.chart.append(added, created);
  }

  /** The command line (from the run's header, fetched once) and optimizer settings. */
  showConfig() {
    renderConfig(this.argv || null, this.optimizers);
    if (this.argv !== undefined) return;
    this.argv = null;
    fetchRun(this.runId).then((run) => {
      this.argv = (run.header && run.header.argv) || [];
      renderConfig(this.argv, this.optimizers);
    }).catch((e) => console.warn("gradwatch: the run's command line was not loaded", e));
  }

  onOptimizer(view) {
    if (!view) return;
    this.optimizers = [...this.optimizers.filter((o) => !(o.opt === view.opt && o.rank === view.rank)), view];
    this.showConfig();
    showNormsChoice(this.optimizers);
    this.params.setRun(this.runId, this.optimizers, this.summary && this.summary.ranks);
    if (!this.params.data) this.params.refresh();
    this.chart.setOptNames(oneName(this.optimizers), labelsOf(this.optimizers));
    if (this.summary) renderSummary(this.summary, this.chart.optLabels);
  }

  setFindings(findings) {
    this.announcer.update(findings);
    this.verdict.set(findings);
    this.chart.setFindings(findings, this.findingKey, findingKey);
  }

  setSummary(run) {
    if (!run) return;
    const wasLive = this.live;
    this.summary = run;
    renderSummary(run, this.chart.optLabels);
    this.notes.set(run);
    this.verdict.setSummary(run);
    document.title = `${run.name || run.id} · gradwatch`;
    if (wasLive && !this.live) {
      // The run ended: its last steps are in; show the player and final parameter view.
      this.follow = false;
      this.updatePlayer();
      this.params.refresh();
    }
    this.setFollowButton();
  }

  // ---- follow, freeze, zoom -------------------------------------------------------------

  setFollowButton() {
    const b = $("btn-follow");
    b.disabled = !this.live;
    b.setAttribute("aria-pressed", String(this.live && this.follow));
  }

  /** Following: the step axis grows with the run. Off: it stays on the steps shown now. */
  toggleFollow() {
    if (this.follow) this.chart.zoomTo(...(this.chart.extent() || [0, 1]));
    else this.chart.zoomOut();
  }

  /** Freeze: new steps are kept, not drawn, until unfrozen (a still chart to read). */
  setFrozen(frozen) {
    if (!frozen) this.held = 0;
    this.chart.setPaused(frozen);
    const b = $("btn-freeze");
    b.setAttribute("aria-pressed", String(frozen));
    b.textContent = frozen ? "Unfreeze chart" : "Freeze chart";
    setText("held", frozen && this.held ? `${count(this.held)} new steps held` : "");
  }

  /** The step window changed (null: the whole run): re-fetch it, downsampled server-side. */
  onRange(range) {
    this.range = range;
    this.follow = !range;
    this.setFollowButton();
    updateState({ zoom: range });
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
      const { series, ss } = await loadWindow(this.runId, range, this.series, maxPoints($("chart")),
        this.norms);
      if (seq !== this.fetchSeq) return;
      this.series = series;
      renderSampling(ss);
      await this.chart.load(this.series, range);
      this.updatePlayer();
      this.land();
    } catch (err) {
      showToast(`Could not load steps: ${err.message}`);
    }
  }

  /** A finding picked in the verdict (or from the URL): its steps, and its first step. */
  pickFinding(f) {
    this.findingKey = findingKey(f);
    updateState({ finding: this.findingKey });
    this.chart.setFindings(this.verdict.findings, this.findingKey, findingKey);
    const span = Math.max(1, f.last_step - f.first_step);
    const pad = Math.max(5, Math.round(span * 0.25));
    this.landOn = f.first_step;
    this.chart.zoomTo(Math.max(0, f.first_step - pad), f.last_step + pad);
    // Findings name an optimizer by its label where it has one; the selector lists ids.
    const info = this.optimizers.find((o) => o.label === f.optimizer && (o.rank || 0) === (f.rank || 0));
    this.params.selectOptimizer(info ? info.opt : f.optimizer, f.rank || 0);
  }

  /** Show the step a picked finding lands on, once its rows are loaded. */
  land() {
    if (this.landOn === null) return;
    const step = this.landOn;
    this.landOn = null;
    this.showStep(step);
  }

  restoreFinding() {
    const f = this.verdict.select(this.findingKey);
    if (f) this.landOn = f.first_step;
  }

  // ---- stored-run player ------------------------------------------------------------------

  updatePlayer() {
    if (this.player.setupFor(this.series, this.live, this.range) && this.cursorNext === null &&
        !this.cursorBusy) {
      setText("readout", readoutText(this.series, Number($("slider").value), this.chart.optName,
        this.chart.optLabels));
    }
  }

  /** Cursor and readout at a step (coalesced: at most one redraw in flight). */
  async showStep(step) {
    setText("readout", readoutText(this.series, step, this.chart.optName, this.chart.optLabels));
    if (!this.live) this.player.place(step);
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

  // ---- exports ---------------------------------------------------------------------------

  stem() {
    return fileStem(this.summary ? this.summary.name : "", this.runId);
  }

  /** The figure an exported PNG draws for this run. */
  pngFigure() {
    return runFigure($("chart"), this.summary || { name: this.runId, id: this.runId },
      this.verdict.findings.length, this.optimizers);
  }

  async downloadPng() {
    await this.chart.ready;
    await downloadFigure(this.pngFigure(), this.stem());
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
    this.announcer.clear();
  }
}

/**
 * Swap the run view's controls for clones, dropping the listeners a previous run view
 * attached, so an old view's handlers never fire for a new run.
 */
function freshControls() {
  const ids = ["btn-follow", "btn-freeze", "btn-reset", "btn-png", "btn-csv", "btn-jsonl", "chk-log",
    "rng-smooth", "sel-x", "sel-norms", "run-tags", "run-notes-text",
    "btn-play", "sel-speed", "slider", "sel-opt", "sel-rank", "sel-metric"];
  for (const id of ids) {
    const old = $(id);
    old.replaceWith(old.cloneNode(true));
  }
  const thead = $("params-table").tHead;
  thead.replaceWith(thead.cloneNode(true));
}

/**
 * The choice of norms shows for a run with parameters sharded across ranks (an optimizer's
 * placements name a Shard, OptimizerInfo.placements), the only runs where they differ.
 */
function showNormsChoice(optimizers) {
  $("sel-norms").hidden = !optimizers.some((o) => (o.placements || "").includes("s"));
}

/**
 * The name findings give the run's one optimizer (its label, else its id: "d_opt",
 * "Adam#0"), for the resets row; null when the run has several (or none). The virtual
 * optimizer of updates by hand makes no optimizer.zero_grad() reset and is left out.
 */
function oneName(optimizers) {
  const names = new Set(optimizers.filter((o) => o.opt !== "manual").map(optName));
  return names.size === 1 ? [...names][0] : null;
}
