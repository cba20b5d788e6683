/**
 * The verdict, first thing in the run view: "clean", or each finding's kind, optimizer,
 * steps, the line to change (`train.py:42`) and the fix. Details (the message, every line
 * involved, the parameters) open on demand. Clicking a finding (or Enter on it) shows its
 * steps on the charts.
 */

import { count, el, setText, stepRange } from "./format.js";
import { findingKind, optimizerText, primaryWhere, whereAt } from "./kinds.js";

const MAX_PARAMS_SHOWN = 8;

/** A finding's identity while its run goes on (its last step and counts may still grow). */
export function findingKey(f) {
  return `${f.kind}:${f.rank || 0}:${f.worker ?? ""}:${f.first_step}:${f.optimizer}`;
}

export class VerdictPanel {
  /**
   * @param {HTMLElement} list the findings <ol>
   * @param {(finding: object) => void} onPick
   */
  constructor(list, onPick) {
    this.list = list;
    this.onPick = onPick;
    this.findings = [];
    this.summary = null;
    this.active = null;
    this.open = new Set();
    this.signature = "";
  }

  /** The run's findings (the full list). */
  set(findings) {
    const sig = JSON.stringify(findings);
    if (sig === this.signature) return;
    this.signature = sig;
    this.findings = findings;
    this.list.replaceChildren(...findings.map((f) => this.item(f)));
    this.renderHead();
  }

  /** The run's summary changed (steps, status): the headline may change with it. */
  setSummary(run) {
    this.summary = run;
    this.renderHead();
  }

  renderHead() {
    const n = this.findings.length;
    const run = this.summary;
    const live = !run || run.status === "live";
    let state = "bad", title = `${count(n)} finding${n === 1 ? "" : "s"}`;
    let sub = "Fix the line shown first; click a finding to see its steps.";
    if (run && run.stopped) {
      // a run judged in part is never clean: say where judging stopped
      if (!n) [state, title] = ["bad", "Judging stopped"];
      sub = `${run.stopped[0].toUpperCase()}${run.stopped.slice(1)}.`;
    } else if (!n) {
      const steps = run ? run.steps : 0;
      if (!steps) [state, title, sub] = ["wait", "No steps yet", "The verdict comes with the first optimizer step."];
      else if (live) [state, title, sub] = ["wait", "No findings so far", `${count(steps)} steps judged; watching live.`];
      else [state, title, sub] = ["good", "Clean", `No findings: every one of ${count(steps)} steps read freshly reset gradients.`];
    }
    document.getElementById("verdict").dataset.state = state;
    setText("verdict-title", title);
    setText("verdict-sub", sub);
  }

  item(f) {
    const key = findingKey(f);
    const kind = findingKind(f.kind);
    const li = el("li", { class: "finding", tabindex: 0, dataset: { kind: f.kind, key } });
    li.style.borderLeftColor = kind.color;
    if (this.active === key) li.classList.add("active");
    const head = el("div", { class: "f-head" });
    const label = el("span", { class: "kind", title: f.kind }, kind.label);
    label.style.color = kind.color;
    head.append(label, el("span", { class: "opt" }, optimizerText(f.optimizer)),
      el("span", { class: "steps" }, `${stepRange(f.first_step, f.last_step)} · ` +
        `${count(f.steps)} affected${f.rank ? ` · rank ${f.rank}` : ""}` +
        `${f.worker !== null && f.worker !== undefined ? ` · worker ${f.worker}` : ""}`));
    const w = primaryWhere(f);
    if (w) {
      head.append(el("code", { class: "at", title: `${w.file}:${w.line} · ${w.role}` +
        `${w.function ? ` in ${w.function}` : ""}` }, whereAt(w)));
    }
    const more = el("button", { type: "button", class: "more", "aria-expanded": "false" }, "details");
    head.append(more);
    const fix = el("p", { class: "fix" });
    fix.append(el("strong", {}, "Fix: "), document.createTextNode(f.fix));
    const details = this.details(f);
    li.append(head, fix, details);
    const setOpen = (on) => {
      li.classList.toggle("open", on);
      details.hidden = !on;
      more.setAttribute("aria-expanded", String(on));
      if (on) this.open.add(key);
      else this.open.delete(key);
    };
    setOpen(this.open.has(key));
    more.addEventListener("click", (ev) => {
      ev.stopPropagation();
      setOpen(!li.classList.contains("open"));
    });
    li.addEventListener("click", () => this.pick(f));
    li.addEventListener("keydown", (ev) => {
      if (ev.target === li && (ev.key === "Enter" || ev.key === " ")) {
        ev.preventDefault();
        this.pick(f);
      }
    });
    return li;
  }

  details(f) {
    const box = el("div", { class: "f-more" });
    box.append(el("p", { class: "msg" }, f.message));
    if (f.where && f.where.length) {
      const first = primaryWhere(f);
      const lines = el("ul", { class: "where-list" });
      for (const w of [first, ...f.where.filter((x) => x !== first)]) {
        const li = el("li");
        li.append(el("code", {}, `${w.file}:${w.line}`),
          el("span", { class: "muted" }, ` ${w.role}${w.function ? ` in ${w.function}` : ""}`));
        lines.append(li);
      }
      box.append(lines);
    }
    if (f.params && f.params.length) {
      const shown = f.params.slice(0, MAX_PARAMS_SHOWN).join(", ");
      const extra = f.params.length - MAX_PARAMS_SHOWN;
      box.append(el("p", { class: "fparams", title: f.params.join("\n") },
        `params: ${shown}${extra > 0 ? ` … +${extra}` : ""}`));
    }
    return box;
  }

  /** Mark a finding as the selected one (null: none); returns it, if listed. */
  select(key) {
    this.active = key;
    let found = null;
    for (const node of this.list.children) {
      const on = node.dataset.key === key;
      node.classList.toggle("active", on);
      if (on) found = node;
    }
    if (found) found.scrollIntoView({ block: "nearest" });
    return this.findings.find((f) => findingKey(f) === key) || null;
  }

  pick(f) {
    this.select(findingKey(f));
    this.onPick(f);
  }
}
