/**
 * Entry point of the dashboard: the run list, the connection indicator, and routing between
 * views by the URL (urlstate.js): `?run=ID` a run, `?compare=ID,ID` runs side by side,
 * neither the welcome page. The access token, if any, travels in the server's cookie.
 */

import { loadPlotly } from "./loadplotly.js";
import { setText } from "./format.js";
import { CompareView } from "./compare.js";
import { RunList } from "./runs.js";
import { RunView } from "./runview.js";
import { LiveSocket } from "./socket.js";
import { goTo, readState, viewHref } from "./urlstate.js";

const $ = (id) => document.getElementById(id);

const sockets = { list: { state: "connecting" }, view: { state: "open" } };
let view = null;

/** One indicator for every socket: the worse state wins. A missing run is not offline. */
function showConnection() {
  const conn = $("conn");
  const states = [sockets.list, sockets.view];
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

function onViewState(s) {
  sockets.view = s;
  showConnection();
}

const runList = new RunList($("runs"), {
  select: (id) => navigate({ run: id }),
  compare: (ids) => navigate({ compare: ids }),
  deleted: (id) => {
    if (view && view.key === `run:${id}`) navigate({});
  },
});

new LiveSocket("/ws/live", {}, {
  runs: (f) => runList.setAll(f.runs || []),
  run: (f) => f.run && runList.upsert(f.run),
  deleted: (f) => runList.remove(f.run),
}, (s) => {
  sockets.list = s;
  showConnection();
});

/** Show the view the URL names (after a load, a navigation, Back or Forward). */
function route() {
  const st = readState();
  const ids = st.compare.length ? st.compare : [];
  const key = ids.length > 1 ? `compare:${ids.join(",")}` : ids.length || st.run ? `run:${ids[0] || st.run}` : "home";
  if (view && view.key === key) return;
  if (view) view.destroy();
  view = null;
  sockets.view = { state: "open" };
  if (key === "home") {
    runList.setCurrent([]);
    loadPlotly();
    for (const v of ["run", "compare", "missing"]) $(v).hidden = true;
    $("welcome").hidden = false;
    setText("crumb", "");
    document.title = "gradwatch";
  } else if (ids.length > 1) {
    runList.setCurrent(ids);
    runList.setPicked(ids);
    setText("crumb", "compare");
    view = new CompareView(ids, onViewState, st, {
      open: (id) => navigate({ run: id }), compare: (next) => navigate(next.length > 1
        ? { compare: next } : { run: next[0] }),
    });
  } else {
    const id = ids[0] || st.run;
    runList.setCurrent([id]);
    document.title = `${id} · gradwatch`;
    view = new RunView(id, onViewState, st);
    view.key = key;
  }
  // Exposed for tests and for poking at from the console.
  window.gradwatch = { view, runList };
  showConnection();
}

function navigate(state) {
  goTo(state);
  route();
}

window.addEventListener("popstate", route);
for (const id of ["brand", "missing-back"]) {
  $(id).href = viewHref({});
  $(id).addEventListener("click", (ev) => {
    if (ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
    ev.preventDefault();
    navigate({});
  });
}
route();
