/**
 * What the page shows, kept in its query string so a reload or a shared link shows the
 * same: `run=ID` or `compare=ID,ID,...`, `zoom=FIRST,LAST` (the step window),
 * `finding=KEY` (the selected finding, verdict.findingKey), `log=1` (log scale) and
 * `smooth=W` (the smoothing weight, 0 to 0.99), `x=relative|wall` (what the x axis
 * counts; steps when absent) and `norms=rank` (a sharded run's norms per rank; the
 * model's when absent).
 *
 * Other parameters of the page URL (the access token) are left as they are.
 */

const OWN = ["run", "compare", "zoom", "finding", "log", "smooth", "x", "norms"];

/** The view state in the current URL. */
export function readState(search = window.location.search) {
  const q = new URLSearchParams(search);
  const zoom = (q.get("zoom") || "").split(",").map(Number);
  const compare = (q.get("compare") || "").split(",").filter(Boolean);
  return {
    run: q.get("run") || null,
    compare: [...new Set(compare)],
    range: zoom.length === 2 && zoom.every(Number.isFinite) && zoom[0] < zoom[1] ? zoom : null,
    finding: q.get("finding") || null,
    log: q.get("log") === "1",
    smooth: Math.min(0.99, Math.max(0, Number(q.get("smooth")) || 0)),
    x: ["relative", "wall"].includes(q.get("x")) ? q.get("x") : "step",
    norms: q.get("norms") === "rank" ? "rank" : "model",
  };
}

function urlWith(changes, clear) {
  const url = new URL(window.location.href);
  if (clear) for (const k of OWN) url.searchParams.delete(k);
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === undefined || v === false || (Array.isArray(v) && !v.length)) {
      url.searchParams.delete(k);
    } else {
      url.searchParams.set(k, encode(k, v));
    }
  }
  // Commas read better unescaped in a shared link, and mean the same in a query string.
  return url.pathname + url.search.replace(/%2C/gi, ",");
}

function encode(key, v) {
  if (key === "zoom") return v.map((x) => String(Math.round(x * 10) / 10)).join(",");
  if (key === "log") return "1";
  return Array.isArray(v) ? v.join(",") : String(v);
}

/**
 * Change parts of the state in place (zoom, finding, log scale): the history entry is
 * replaced, so Back still leaves the run rather than undoing each zoom.
 */
export function updateState(changes) {
  const url = urlWith(changes, false);
  if (url !== window.location.pathname + window.location.search) {
    history.replaceState(history.state, "", url);
  }
}

/** Go to another view (a run, a comparison, the run list): a new history entry. */
export function goTo(changes) {
  const url = urlWith(changes, true);
  if (url !== window.location.pathname + window.location.search) {
    history.pushState(null, "", url);
  }
}

/** A link to a view, keeping the page's other parameters (the token). */
export function viewHref(changes) {
  return urlWith(changes, true);
}
