/**
 * A static canvas drawing of the run's first snapshot, shown while plotly.js is still being
 * evaluated (the snapshot usually arrives first; bench/dashboard.py times both). Same panels
 * (panels.js) and margins as the plotly figure, which replaces it as soon as it is ready; it
 * is not interactive.
 */

import { usedRows } from "./events.js";
import { findingKind } from "./kinds.js";
import { STRIP_MARGIN, stripFraction } from "./layout.js";
import { PANELS, panelDomains, shownPanels } from "./panels.js";

const MARGIN = { l: STRIP_MARGIN, r: 16, t: 10, b: 40 };

/**
 * Draw series (Map key -> Series) and findings into a canvas placed in `host`.
 * @returns {HTMLCanvasElement} the canvas (remove it when the real chart is drawn)
 */
export function drawPreview(host, series, findings, colors) {
  const w = host.clientWidth, h = host.clientHeight;
  const dpr = window.devicePixelRatio || 1;
  const canvas = document.createElement("canvas");
  canvas.className = "preview";
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  canvas.setAttribute("aria-hidden", "true");
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  const pw = w - MARGIN.l - MARGIN.r, ph = h - MARGIN.t - MARGIN.b;
  let x0 = Infinity, x1 = -Infinity;
  for (const s of series.values()) {
    if (!s.length) continue;
    x0 = Math.min(x0, s.step[0]);
    x1 = Math.max(x1, s.lastStep);
  }
  if (!(x1 >= x0)) return canvas;
  if (x1 === x0) x1 = x0 + 1;
  const X = (x) => MARGIN.l + ((x - x0) / (x1 - x0)) * pw;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#8b96a3";

  const shown = shownPanels(series.values());
  const domains = panelDomains(stripFraction(usedRows(series.values()).length, h), shown);
  const lowest = Math.min(...domains.filter((d) => d).map((d) => d[0]));
  const bandTop = MARGIN.t, bandBottom = MARGIN.t + (1 - lowest) * ph;
  for (const f of findings) {
    ctx.fillStyle = findingKind(f.kind).band;
    const a = X(f.first_step - 0.5), b = X(f.last_step + 0.5);
    ctx.fillRect(a, bandTop, Math.max(1, b - a), bandBottom - bandTop);
  }

  PANELS.forEach((panel, p) => {
    if (!domains[p]) return;
    const [lo, hi] = domains[p];
    const top = MARGIN.t + (1 - hi) * ph, bottom = MARGIN.t + (1 - lo) * ph;
    const cols = panel.traces.map((t) => t.column);
    let ymax = panel.key === "drift" ? 1 : 0;
    for (const s of series.values()) {
      for (const col of cols) {
        for (const v of s[col]) if (v !== null && v > ymax) ymax = v;
      }
    }
    ymax = ymax > 0 ? ymax * 1.05 : 1;
    const Y = (v) => bottom - (v / ymax) * (bottom - top);
    ctx.strokeStyle = "#2a323d";
    ctx.lineWidth = 1;
    ctx.strokeRect(MARGIN.l, top, pw, bottom - top);
    ctx.fillStyle = "#8b96a3";
    ctx.textAlign = "right";
    ctx.fillText(ymax.toPrecision(3), MARGIN.l - 6, top + 10);
    ctx.fillText("0", MARGIN.l - 6, bottom);
    ctx.save();
    ctx.translate(18, (top + bottom) / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "center";
    ctx.fillText(panel.title, 0, 0);
    ctx.restore();
    if (panel.key === "drift") {
      ctx.setLineDash([5, 4]);
      ctx.strokeStyle = "#8b96a3";
      ctx.beginPath();
      ctx.moveTo(MARGIN.l, Y(1));
      ctx.lineTo(MARGIN.l + pw, Y(1));
      ctx.stroke();
    }
    let k = 0;
    for (const s of series.values()) {
      const color = colors[k++];
      for (const spec of panel.traces) {
        if (spec.smooth) continue; // the preview draws the raw lines
        const col = spec.column;
        ctx.setLineDash(spec.dash ? [2, 3] : []);
        ctx.strokeStyle = color;
        ctx.lineWidth = spec.width;
        ctx.beginPath();
        let pen = false;
        const ys = s[col];
        for (let i = 0; i < s.length; i++) {
          if (ys[i] === null) {
            pen = false;
            continue;
          }
          if (pen) ctx.lineTo(X(s.step[i]), Y(ys[i]));
          else ctx.moveTo(X(s.step[i]), Y(ys[i]));
          pen = true;
        }
        ctx.stroke();
      }
    }
  });
  ctx.setLineDash([]);
  ctx.fillStyle = "#8b96a3";
  ctx.textAlign = "left";
  ctx.fillText(String(x0), MARGIN.l, h - MARGIN.b + 16);
  ctx.textAlign = "right";
  ctx.fillText(String(x1), MARGIN.l + pw, h - MARGIN.b + 16);
  ctx.textAlign = "center";
  ctx.fillText("loading the interactive chart…", MARGIN.l + pw / 2, h - 8);
  host.append(canvas);
  return canvas;
}
