/**
 * The run list in the sidebar: live and stored runs with status, steps, findings and start
 * time, kept current by the `/ws/live` run-list socket. Search by name, filter by status
 * and by "has findings", pick runs to compare, rename and delete (runactions.js).
 */

import { count, el, setText, when } from "./format.js";
import { confirmDelete, startRename } from "./runactions.js";
import { viewHref } from "./urlstate.js";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const ICONS = {
  rename: "M3 17.2V21h3.8l11-11-3.8-3.8-11 11zM20.7 7a1 1 0 0 0 0-1.4l-2.3-2.3a1 1 0 0 0-1.4 0l-1.8 1.8 3.8 3.8L20.7 7z",
  delete: "M6 19a2 2 0 0 0 2 2h8a2 2 0 0 0 2-2V7H6v12zM19 4h-3.5l-1-1h-5l-1 1H5v2h14V4z",
};

export class RunList {
  /**
   * @param {HTMLElement} ul the list element
   * @param {{select: (id: string) => void, compare: (ids: string[]) => void,
   *   deleted: (id: string) => void}} on what picking, comparing and deleting runs does
   */
  constructor(ul, on) {
    this.ul = ul;
    this.on = on;
    this.runs = new Map();
    this.items = new Map();
    this.current = new Set();
    this.picked = new Set();
    this.filter = { text: "", status: "", findings: false };
    $("run-search").addEventListener("input", (ev) => this.setFilter({ text: ev.target.value }));
    $("run-status-filter").addEventListener("change", (ev) => this.setFilter({ status: ev.target.value }));
    $("run-has-findings").addEventListener("change", (ev) => this.setFilter({ findings: ev.target.checked }));
    $("btn-compare").addEventListener("click", () => this.on.compare([...this.picked]));
    $("btn-compare-clear").addEventListener("click", () => this.setPicked([]));
  }

  /** The full list (first frame after each connect). */
  setAll(runs) {
    this.runs = new Map(runs.map((r) => [r.id, r]));
    for (const id of [...this.items.keys()]) {
      if (!this.runs.has(id)) this.items.delete(id);
    }
    this.render();
  }

  upsert(run) {
    const had = this.runs.has(run.id);
    this.runs.set(run.id, run);
    if (had && this.items.has(run.id)) {
      this.fill(this.items.get(run.id), run);
      this.applyFilter();
    } else {
      this.render();
    }
  }

  remove(id) {
    this.runs.delete(id);
    this.items.delete(id);
    this.picked.delete(id);
    this.render();
  }

  get(id) {
    return this.runs.get(id);
  }

  /** The run(s) on screen: highlighted in the list. */
  setCurrent(ids) {
    this.current = new Set(ids);
    for (const [rid, li] of this.items) {
      const a = li.querySelector("a");
      if (this.current.has(rid)) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
  }

  /** The runs ticked for comparison. */
  setPicked(ids) {
    this.picked = new Set(ids);
    for (const [rid, li] of this.items) li.querySelector("input.pick").checked = this.picked.has(rid);
    this.renderPicked();
  }

  renderPicked() {
    const n = this.picked.size;
    $("compare-bar").hidden = n === 0;
    setText("compare-count", `${count(n)} selected`);
    $("btn-compare").disabled = n < 2;
    $("btn-compare").title = n < 2 ? "Tick two or more runs to compare them" : `Overlay ${n} runs`;
  }

  setFilter(change) {
    Object.assign(this.filter, change);
    this.applyFilter();
  }

  matches(run) {
    const f = this.filter;
    const text = f.text.trim().toLowerCase();
    const about = `${run.name}\n${run.id}\n${(run.tags || []).join("\n")}\n${run.notes || ""}`;
    if (text && !about.toLowerCase().includes(text)) return false;
    if (f.status && run.status !== f.status) return false;
    return !(f.findings && !run.findings);
  }

  applyFilter() {
    let shown = 0;
    for (const [id, li] of this.items) {
      const ok = this.matches(this.runs.get(id));
      li.hidden = !ok;
      if (ok) shown += 1;
    }
    const total = this.runs.size;
    setText("run-count", !total ? "" : shown === total ? count(total) : `${count(shown)} of ${count(total)}`);
    $("runs-empty").hidden = total > 0;
    $("runs-none-match").hidden = !total || shown > 0;
  }

  render() {
    const sorted = [...this.runs.values()].sort((a, b) => (b.started || 0) - (a.started || 0));
    const nodes = sorted.map((run) => {
      let li = this.items.get(run.id);
      if (!li) {
        li = this.create(run.id);
        this.items.set(run.id, li);
      }
      this.fill(li, run);
      return li;
    });
    this.ul.replaceChildren(...nodes);
    this.applyFilter();
    this.setCurrent(this.current);
    this.setPicked([...this.picked].filter((id) => this.runs.has(id)));
  }

  create(id) {
    const li = el("li", { dataset: { run: id } });
    const pick = el("input", { type: "checkbox", class: "pick", title: "Select to compare" });
    pick.addEventListener("change", () => {
      if (pick.checked) this.picked.add(id);
      else this.picked.delete(id);
      this.renderPicked();
    });
    const a = el("a", { href: viewHref({ run: id }) });
    a.append(el("span", { class: "name" }), el("span", { class: "badge" }), el("span", { class: "tags" }),
      el("span", { class: "meta" }));
    a.addEventListener("click", (ev) => {
      if (ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
      ev.preventDefault();
      this.on.select(id);
    });
    const actions = el("span", { class: "actions" });
    const rename = iconButton("rename", "Rename");
    rename.addEventListener("click", () => startRename(a, this.runs.get(id)));
    const del = iconButton("delete", "Delete");
    del.addEventListener("click", async () => {
      if (await confirmDelete(this.runs.get(id))) this.on.deleted(id);
    });
    actions.append(rename, del);
    li.append(pick, a, actions);
    return li;
  }

  fill(li, run) {
    const [name, badge, meta] = [".name", ".badge", ".meta"].map((c) => li.querySelector(`a ${c}`));
    const label = run.name || run.id;
    setText(name, label);
    name.title = run.name && run.name !== run.id ? `${run.name} (${run.id})` : run.id;
    li.querySelector("input.pick").setAttribute("aria-label", `Compare ${label}`);
    for (const b of li.querySelectorAll(".actions button")) {
      b.setAttribute("aria-label", `${b.dataset.act} ${label}`);
    }
    setText(badge, run.status);
    badge.dataset.status = run.status;
    const tags = li.querySelector("a .tags");
    const tagSig = (run.tags || []).join("\n");
    if (tags.dataset.sig !== tagSig) {
      tags.dataset.sig = tagSig;
      tags.replaceChildren(...(run.tags || []).map((t) => el("span", { class: "tag" }, t)));
    }
    if (run.notes) name.title += `\n${run.notes}`;
    const parts = [
      el("span", {}, `${count(run.steps)} steps`),
      el("span", { class: run.findings ? "nfind" : "" },
        `${count(run.findings)} finding${run.findings === 1 ? "" : "s"}`),
      el("span", {}, when(run.started)),
    ];
    const sig = parts.map((p) => p.textContent + p.className).join("|");
    if (meta.dataset.sig !== sig) {
      meta.dataset.sig = sig;
      meta.replaceChildren(...parts);
    }
  }
}

function iconButton(icon, act) {
  const b = el("button", { type: "button", class: `act act-${icon}`, title: act, dataset: { act } });
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", ICONS[icon]);
  svg.append(path);
  b.append(svg);
  return b;
}
