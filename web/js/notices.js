/**
 * Messages in the corner: a short-lived toast (an export failed, a server error), and the
 * announcement of a finding that arrived while the run was open, which fades out after a
 * while (the verdict keeps the finding) unless the pointer rests on it, or is dismissed. Both
 * carry wire text, so both write it with textContent.
 */

import { el, setText, stepRange } from "./format.js";
import { findingKind, optimizerText, primaryWhere, whereAt } from "./kinds.js";
import { findingKey } from "./verdict.js";

const $ = (id) => document.getElementById(id);
const TOAST_MS = 6000;
/** How long an announcement stays before it fades (counted again after a hover). */
export const NOTICE_MS = 12000;
/** The fade's length (the CSS transition of .notice.fading). */
const FADE_MS = 600;
/** Announcements shown one by one; more than this fold into one "N more" notice. */
const MAX_SHOWN = 3;

let toastTimer = 0;
/** A short message in the corner (export failures, server errors). */
export function showToast(text) {
  const t = $("toast");
  setText(t, text);
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, TOAST_MS);
}

/**
 * Announces findings that were not there before. The first list it sees (the run's
 * snapshot) is what the user opened the run with: only later arrivals are announced, also
 * those that came while the socket was away.
 */
export class Announcer {
  /**
   * @param {HTMLElement} box the notices container
   * @param {(finding: object) => void} onShow "Show" on a notice: select that finding
   */
  constructor(box, onShow) {
    this.box = box;
    this.onShow = onShow;
    this.known = null;
    this.more = null;
    this.moreCount = 0;
  }

  /** The run's current findings; announces those never seen in this view before. */
  update(findings) {
    const fresh = [];
    const keys = new Set(findings.map(findingKey));
    if (this.known === null) {
      this.known = keys;
      return;
    }
    for (const f of findings) {
      const key = findingKey(f);
      if (!this.known.has(key)) fresh.push(f);
      this.known.add(key);
    }
    for (const f of fresh) this.announce(f);
  }

  announce(f) {
    if (this.box.querySelectorAll(".notice[data-key]").length >= MAX_SHOWN) {
      this.moreCount += 1;
      if (!this.more) {
        this.more = this.notice(el("strong"), null);
        this.box.append(this.more);
      }
      setText(this.more.querySelector("strong"),
        `${this.moreCount} more new finding${this.moreCount === 1 ? "" : "s"}: see the verdict`);
      return;
    }
    const kind = findingKind(f.kind);
    const text = el("div", { class: "n-text" });
    const title = el("strong", {}, `New finding: ${kind.label}`);
    title.style.color = kind.color;
    const w = primaryWhere(f);
    text.append(title, el("span", {}, ` on ${optimizerText(f.optimizer)}, ` +
      `from ${stepRange(f.first_step, f.first_step)}${w ? ` · ${whereAt(w)}` : ""}`));
    const node = this.notice(text, f);
    node.dataset.key = findingKey(f);
    node.dataset.kind = f.kind;
    node.style.borderLeftColor = kind.color;
    this.box.append(node);
  }

  notice(content, finding) {
    const node = el("div", { class: "notice", role: "alert" });
    const actions = el("div", { class: "n-actions" });
    if (finding) {
      const show = el("button", { type: "button", class: "n-show" }, "Show");
      show.addEventListener("click", () => this.onShow(finding));
      actions.append(show);
    }
    const close = el("button", { type: "button", class: "n-close", "aria-label": "Dismiss",
      title: "Dismiss" }, "×");
    close.addEventListener("click", () => this.dismiss(node));
    actions.append(close);
    node.append(content, actions);
    this.fadeLater(node);
    node.addEventListener("mouseenter", () => {
      clearTimeout(node.fadeTimer);
      node.classList.remove("fading");
    });
    node.addEventListener("mouseleave", () => this.fadeLater(node));
    return node;
  }

  /** Fade `node` out in NOTICE_MS, then remove it (as a dismissal). */
  fadeLater(node) {
    clearTimeout(node.fadeTimer);
    node.fadeTimer = setTimeout(() => {
      node.classList.add("fading");
      node.fadeTimer = setTimeout(() => this.dismiss(node), FADE_MS);
    }, NOTICE_MS);
  }

  dismiss(node) {
    clearTimeout(node.fadeTimer);
    node.remove();
    if (node === this.more) {
      this.more = null;
      this.moreCount = 0;
    }
  }

  /** Leave the run: its notices go with it. */
  clear() {
    this.box.replaceChildren();
    this.known = null;
    this.more = null;
    this.moreCount = 0;
  }
}
