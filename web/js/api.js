/**
 * REST access to the gradwatch server (see server/API.md).
 *
 * The page never holds the access token: opened once as `/?token=...`, the server answers
 * with an HttpOnly, SameSite=Strict cookie and sends the browser on to the same URL without
 * the token, so it stays out of the address bar, the history and logs. Same-origin fetches
 * and websockets carry the cookie. Every request is marked `X-Gradwatch: 1`, which a page
 * on another site cannot add (the server's rule for requests that change data).
 */

/** Absolute ws:// or wss:// URL of a server path. */
export function wsUrl(path, query = {}) {
  const proto = window.location.protocol === "https:" ? "wss:" : "ws:";
  const url = new URL(path, `${proto}//${window.location.host}`);
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined) url.searchParams.set(k, String(v));
  }
  return url.toString();
}

/** An error from the server, carrying its HTTP status and `detail` sentence. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
  }
}

function headers() {
  return { "X-Gradwatch": "1" };
}

async function request(path, query = {}, init = {}) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  const resp = await fetch(url, { ...init, headers: { ...headers(), ...(init.headers || {}) } });
  if (!resp.ok) {
    let detail = "";
    try {
      detail = (await resp.json()).detail;
    } catch {
      detail = resp.statusText;
    }
    throw new ApiError(resp.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return resp;
}

async function getJson(path, query = {}, init = {}) {
  return (await request(path, query, init)).json();
}

/**
 * StepSeries of one run, for steps in [start, end], downsampled to maxPoints per series;
 * `norms`: a sharded optimizer's norms as the model's ("model", the server's default) or
 * each rank's own ("rank").
 */
export function fetchSteps(runId, { start, end, maxPoints, norms, signal } = {}) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}/steps`,
    { start, end, max_points: maxPoints, norms }, { signal });
}

/** Per-parameter norms of one optimizer (heatmap and table). */
export function fetchParams(runId, { opt, rank, start, end, maxPoints, signal } = {}) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}/params`,
    { opt, rank, start, end, max_points: maxPoints }, { signal });
}

/** Values the user logged (ScalarSeries: rank, opt, step, name, value columns). */
export function fetchScalars(runId) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}/scalars`);
}

/** RunSummary plus optimizers and header. */
export function fetchRun(runId) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}`);
}

/** Give a run a new display name; resolves with its RunSummary. */
export async function renameRun(runId, name) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}`, {}, {
    method: "PATCH", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name }),
  });
}

/** Set a run's notes and/or tags ({notes?, tags?}); resolves with its RunSummary. */
export async function annotateRun(runId, change) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}`, {}, {
    method: "PATCH", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(change),
  });
}

/** Delete a run and everything stored for it. */
export async function deleteRun(runId) {
  await request(`/api/runs/${encodeURIComponent(runId)}`, {}, { method: "DELETE" });
}

/**
 * Download the run as CSV or JSON Lines, as `filename` when given (else the server's
 * name). A plain link cannot carry the Authorization header, so the file is fetched and
 * handed to the browser as a blob.
 */
export async function downloadExport(runId, format, filename = null) {
  const resp = await request(`/api/runs/${encodeURIComponent(runId)}/export`, { format });
  const blob = await resp.blob();
  const disp = resp.headers.get("Content-Disposition") || "";
  const m = /filename="?([^";]+)"?/.exec(disp);
  const name = filename || (m ? m[1] : `${runId}.${format}`);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}
