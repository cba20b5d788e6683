/**
 * What the run list lets a user do to a run besides opening it: rename it in place, and
 * delete it after a confirmation that names it. Both go to the server (api.js); the list
 * itself changes when the server's live `run` and `deleted` frames arrive.
 */

import { ApiError, deleteRun, renameRun } from "./api.js";
import { el, setText } from "./format.js";
import { showToast } from "./notices.js";

/**
 * Swap a run's entry for a text field holding its name: Enter (or leaving the field)
 * saves, Escape cancels. A refused name (taken, empty) is reported and the field stays
 * open to fix it.
 *
 * @param {HTMLElement} entry the element showing the run (hidden while editing)
 * @param {{id: string, name: string}} run
 */
export function startRename(entry, run) {
  if (entry.parentNode.querySelector("input.rename")) return;
  const input = el("input", { type: "text", class: "rename", value: run.name || run.id,
    maxlength: 200, "aria-label": `New name for run ${run.name || run.id}` });
  entry.hidden = true;
  entry.after(input);
  input.focus();
  input.select();
  let busy = false;
  const finish = () => {
    input.remove();
    entry.hidden = false;
  };
  const save = async () => {
    const name = input.value.trim();
    if (busy) return;
    if (!name || name === run.name) {
      finish();
      return;
    }
    busy = true;
    try {
      const summary = await renameRun(run.id, name);
      setText(entry.querySelector(".name") || entry, summary.name);
      finish();
    } catch (err) {
      showToast(`Could not rename: ${err instanceof ApiError ? err.message : String(err)}`);
      busy = false;
      input.focus();
    }
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") {
      ev.preventDefault();
      save();
    } else if (ev.key === "Escape") {
      ev.preventDefault();
      busy = true;
      finish();
    }
  });
  input.addEventListener("blur", () => {
    if (input.isConnected && !busy) save();
  });
}

/**
 * Ask before deleting a run (a modal naming it), then delete it. Resolves true when the
 * run was deleted.
 */
export function confirmDelete(run) {
  const dialog = document.getElementById("confirm-delete");
  setText("confirm-delete-name", run.name || run.id);
  setText("confirm-delete-id", run.id);
  return new Promise((resolve) => {
    const onClose = async () => {
      dialog.removeEventListener("close", onClose);
      if (dialog.returnValue !== "delete") {
        resolve(false);
        return;
      }
      try {
        await deleteRun(run.id);
        resolve(true);
      } catch (err) {
        showToast(`Could not delete: ${err instanceof ApiError ? err.message : String(err)}`);
        resolve(false);
      }
    };
    dialog.returnValue = "";
    dialog.addEventListener("close", onClose);
    dialog.showModal();
    dialog.querySelector("button[value='cancel']").focus();
  });
}
