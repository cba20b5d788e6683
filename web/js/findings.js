/**
 * The findings panel: each finding's kind, optimizer, step range, parameters, the
 * explanation and the fix. Clicking one (or Enter on it) zooms the charts to its steps.
 */

import { count, el, kindLabel, setText, stepRange } from "./format.js";

const MAX_PARAMS_SHOWN = 8;

export class FindingsPanel {
  /**
   * @param {HTMLElement} list the <ol>
   * @param {(finding: object) => void} onPick
   */
  constructor(list, onPick) {
    this.list = list;
    this.onPick = onPick;
    this.findings = [];
    this.active = null;
    this.signature = "";
  }

  set(findings) {
    const sig = JSON.stringify(findings);
    if (sig === this.signature) return;
    this.signature = sig;
    this.findings = findings;
    const items = findings.map((f, i) => this.item(f, i));
    this.list.replaceChildren(...items);
    setText("finding-count", count(findings.length));
    document.getElementById("finding-count").classList.toggle("has", findings.length > 0);
    document.getElementById("findings-empty").hidden = findings.length > 0;
  }

  item(f, i) {
    const li = el("li", { class: "finding", tabindex: 0, dataset: { kind: f.kind, index: i } });
    if (this.active === keyOf(f)) li.classList.add("active");
    const head = el("div", { class: "f-head" });
    head.append(
      el("span", { class: "kind", title: f.kind }, kindLabel(f.kind)),
      el("span", { class: "opt" }, f.optimizer),
      el("span", { class: "where" },
        `${stepRange(f.first_step, f.last_step)} · ${count(f.steps)} affected` +
        (f.rank ? ` · rank ${f.rank}` : "")),
    );
    li.append(head, el("p", { class: "msg" }, f.message), el("p", { class: "fix" }, f.fix));
    if (f.params && f.params.length) {
      const shown = f.params.slice(0, MAX_PARAMS_SHOWN).join(", ");
      const more = f.params.length > MAX_PARAMS_SHOWN ? ` … +${f.params.length - MAX_PARAMS_SHOWN}` : "";
      li.append(el("p", { class: "fparams", title: f.params.join("\n") }, `params: ${shown}${more}`));
    }
    const pick = () => {
      this.active = keyOf(f);
      for (const node of this.list.children) node.classList.toggle("active", node === li);
      this.onPick(f);
    };
    li.addEventListener("click", pick);
    li.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        pick();
      }
    });
    return li;
  }
}

function keyOf(f) {
  return `${f.kind}|${f.optimizer}|${f.rank}|${f.first_step}`;
}
