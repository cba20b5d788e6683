/**
 * Loading plotly.js: preloaded by index.html (the pinned partial bundle vendored in
 * web/vendor/, served with a long cache lifetime), run when the page is ready to spend the
 * main thread on it.
 */

const PLOTLY_SRC = "/static/vendor/plotly.min.js";
/** Longest wait for a first preview before plotly.js is run anyway. */
const PLOTLY_WAIT_MS = 2000;
let plotlyTag = null;
let resolvePlotly;
const plotlyReady = new Promise((resolve) => {
  resolvePlotly = resolve;
});

/**
 * Run plotly.js (preloaded by index.html). Evaluating it blocks the main thread for a
 * second or more on a slow machine, so the page first draws the run's snapshot as a
 * canvas preview, then calls this; it is also called after PLOTLY_WAIT_MS regardless.
 */
export function loadPlotly() {
  if (plotlyTag) return plotlyReady;
  plotlyTag = document.createElement("script");
  plotlyTag.src = PLOTLY_SRC;
  plotlyTag.addEventListener("load", () => {
    performance.mark("gradwatch:plotly-loaded");
    resolvePlotly(window.Plotly);
  });
  plotlyTag.addEventListener("error", () => console.error("gradwatch: could not load plotly.js"));
  document.head.append(plotlyTag);
  return plotlyReady;
}
setTimeout(loadPlotly, PLOTLY_WAIT_MS);

/** Resolves with the Plotly global once plotly.js has loaded. */
export function whenPlotly() {
  return plotlyReady;
}
