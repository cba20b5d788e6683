/**
 * The run list in the sidebar: live and stored runs with status, steps, findings and
 * start time, kept current by the `/ws/live` run-list socket.
 */

import { pageUrl } from "./api.js";
import { count, el, setText, when } from "./format.js";

export class RunList {
  /**
   * @param {HTMLElement} ul the list element
   * @param {(id: string) => void} onSelect called when the user picks a run
   */
  constructor(ul, onSelect) {
    this.ul = ul;
    this.onSelect = onSelect;
    this.runs = new Map();
    this.items = new Map();
    this.current = null;
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
    if (had && this.items.has(run.id)) this.fill(this.items.get(run.id), run);
    else this.render();
  }

  remove(id) {
    this.runs.delete(id);
    this.items.delete(id);
    this.render();
  }

  get(id) {
    return this.runs.get(id);
  }

  setCurrent(id) {
    this.current = id;
    for (const [rid, li] of this.items) {
      const a = li.firstChild;
      if (rid === id) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
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
    setText("run-count", sorted.length ? count(sorted.length) : "");
    document.getElementById("runs-empty").hidden = sorted.length > 0;
    this.setCurrent(this.current);
  }

  create(id) {
    const li = el("li", { dataset: { run: id } });
    const a = el("a", { href: pageUrl({ run: id }) });
    a.append(
      el("span", { class: "name" }),
      el("span", { class: "badge" }),
      el("span", { class: "meta" }),
    );
    a.addEventListener("click", (ev) => {
      if (ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
      ev.preventDefault();
      this.onSelect(id);
    });
    li.append(a);
    return li;
  }

  fill(li, run) {
    const a = li.firstChild;
    const [name, badge, meta] = a.children;
    setText(name, run.name || run.id);
    name.title = run.name && run.name !== run.id ? `${run.name} (${run.id})` : run.id;
    setText(badge, run.status);
    badge.dataset.status = run.status;
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
