/**
 * REST access to the gradwatch server (see server/API.md).
 *
 * The access token comes from the page URL (`/?token=...`) and is kept for the life of the
 * page: REST calls send it as `Authorization: Bearer`, websockets as `?token=`.
 */

const params = new URLSearchParams(window.location.search);
const TOKEN = params.get("token") || "";

/** The token the page was opened with ("" when none). */
export function token() {
  return TOKEN;
}

/** Absolute ws:// or wss:// URL of a server path, with the token added. */
export function wsUrl(path, query = {}) {
  const proto = window.location.protocol === "https:" ? "wss:" : "ws:";
  const url = new URL(path, `${proto}//${window.location.host}`);
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined) url.searchParams.set(k, String(v));
  }
  if (TOKEN) url.searchParams.set("token", TOKEN);
  return url.toString();
}

/** A page URL that keeps the token, for links between dashboard views. */
export function pageUrl(query = {}) {
  const url = new URL("/", window.location.origin);
  if (TOKEN) url.searchParams.set("token", TOKEN);
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined) url.searchParams.set(k, String(v));
  }
  return url.pathname + url.search;
}

/** An error from the server, carrying its HTTP status and `detail` sentence. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
  }
}

function headers() {
  return TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};
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

/** StepSeries of one run, for steps in [start, end], downsampled to maxPoints per series. */
export function fetchSteps(runId, { start, end, maxPoints, signal } = {}) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}/steps`,
    { start, end, max_points: maxPoints }, { signal });
}

/** Per-parameter norms of one optimizer (heatmap and table). */
export function fetchParams(runId, { opt, rank, start, end, maxPoints, signal } = {}) {
  return getJson(`/api/runs/${encodeURIComponent(runId)}/params`,
    { opt, rank, start, end, max_points: maxPoints }, { signal });
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
