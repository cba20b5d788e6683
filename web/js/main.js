/**
 * Entry point of the dashboard: the run list, the connection indicator, and routing
 * between runs (`/?run=ID`; the access token, if any, travels in the server's cookie).
 */

import { pageUrl } from "./api.js";
import { loadPlotly } from "./loadplotly.js";
import { setText } from "./format.js";
import { RunList } from "./runs.js";
import { RunView } from "./runview.js";
import { LiveSocket } from "./socket.js";

const $ = (id) => document.getElementById(id);

const sockets = { list: { state: "connecting" }, run: { state: "open" } };
let view = null;

/** One indicator for both sockets: the worse state wins. */
function showConnection() {
  const conn = $("conn");
  const states = [sockets.list, sockets.run];
  const bad = states.find((s) => s.state === "closed") || states.find((s) => s.state === "connecting");
  let text = "connected";
  let state = "open";
  if (bad && bad.state === "closed") {
    state = "closed";
    const secs = Math.max(1, Math.round((bad.retryIn || 0) / 1000));
    text = bad.reason ? `offline: ${bad.reason} · retry in ${secs}s` : `offline · reconnecting in ${secs}s`;
  } else if (bad) {
    state = "connecting";
    text = "connecting…";
  }
  conn.dataset.state = state;
  setText("conn-text", text);
  conn.title = text;
}

function onListState(s) {
  sockets.list = s;
  showConnection();
}

function onRunState(s) {
  sockets.run = s;
  showConnection();
}

const runList = new RunList($("runs"), (id) => navigate(id));

new LiveSocket("/ws/live", {}, {
  runs: (f) => runList.setAll(f.runs || []),
  run: (f) => f.run && runList.upsert(f.run),
  deleted: (f) => runList.remove(f.run),
}, onListState);

function currentRunId() {
  return new URLSearchParams(window.location.search).get("run");
}

function open(runId) {
  if (view && view.runId === runId) return;
  if (view) view.destroy();
  view = null;
  sockets.run = { state: "open" };
  runList.setCurrent(runId);
  if (!runId) {
    loadPlotly();
    $("run").hidden = true;
    $("welcome").hidden = false;
    setText("crumb", "");
    document.title = "gradwatch";
    showConnection();
    return;
  }
  document.title = `${runId} · gradwatch`;
  view = new RunView(runId, onRunState);
  // Exposed for tests and for poking at from the console.
  window.gradwatch = { view };
}

function navigate(runId) {
  const url = pageUrl(runId ? { run: runId } : {});
  if (url !== window.location.pathname + window.location.search) {
    history.pushState({ run: runId }, "", url);
  }
  open(runId);
}

window.addEventListener("popstate", () => open(currentRunId()));
$("brand").addEventListener("click", (ev) => {
  ev.preventDefault();
  navigate(null);
});
open(currentRunId());
