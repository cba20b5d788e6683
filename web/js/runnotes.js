/**
 * The run's notes and tags on its page: edited in place and saved when the field is left
 * (PATCH /api/runs/{id}); the run list shows and searches them, exports carry them. What
 * the server says back (and what other tabs save) is shown unless the user is typing.
 */

import { ApiError, annotateRun } from "./api.js";
import { setText } from "./format.js";
import { showToast } from "./notices.js";

const $ = (id) => document.getElementById(id);

/** Tags as typed in the one-line field: comma separated, trimmed, no empties or repeats. */
export function parseTags(text) {
  return [...new Set(String(text).split(",").map((t) => t.trim()).filter(Boolean))];
}

export class RunNotes {
  /** @param {string} runId the run shown; its inputs are fresh (no old listeners) */
  constructor(runId) {
    this.runId = runId;
    this.notes = $("run-notes-text");
    this.tags = $("run-tags");
    this.saved = { notes: "", tags: [] };
    this.notes.addEventListener("change", () => this.save({ notes: this.notes.value }));
    this.tags.addEventListener("change", () => this.save({ tags: parseTags(this.tags.value) }));
    this.notes.addEventListener("input", () => this.fit());
    this.set(null);
  }

  /** Show a RunSummary's notes and tags (not over what the user is typing). */
  set(run) {
    this.saved = { notes: (run && run.notes) || "", tags: (run && run.tags) || [] };
    if (document.activeElement !== this.notes) this.notes.value = this.saved.notes;
    if (document.activeElement !== this.tags) this.tags.value = this.saved.tags.join(", ");
    this.fit();
  }

  /** The notes box grows with its text (up to the CSS max-height). */
  fit() {
    this.notes.style.height = "auto";
    this.notes.style.height = `${this.notes.scrollHeight + 2}px`;
  }

  async save(change) {
    setText("notes-state", "saving…");
    try {
      const run = await annotateRun(this.runId, change);
      this.set(run);
      setText("notes-state", "saved");
    } catch (err) {
      setText("notes-state", "not saved");
      showToast(`Could not save: ${err instanceof ApiError ? err.message : String(err)}`);
    }
  }
}
