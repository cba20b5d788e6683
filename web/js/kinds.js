/**
 * What the dashboard calls things: finding kinds and reset kinds, their colours, and the
 * source line a finding points at. Every module names a kind through here, so the strip,
 * the readout, the verdict, the legend and an exported PNG all say the same words.
 *
 * `primaryWhere` mirrors gradwatch.locations.primary (a test holds both to one fixture).
 */

/** Finding kinds (the wire's names) -> label, colour, band fill and what the band means. */
const FINDING_KINDS = {
  missed_reset: {
    label: "missed reset", color: "#f26d6d", band: "rgba(242,109,109,0.16)",
    means: "steps that re-applied gradients an earlier step had already used",
  },
  late_reset: {
    label: "late reset", color: "#e3a13b", band: "rgba(227,161,59,0.17)",
    means: "steps whose fresh gradient a reset between backward() and step() threw away",
  },
  cross_optimizer_leak: {
    label: "cross-optimizer leak", color: "#b58cff", band: "rgba(181,140,255,0.17)",
    means: "steps that applied gradients another optimizer's loss left behind",
  },
  discarded_accumulation: {
    label: "discarded accumulation", color: "#d97bd0", band: "rgba(217,123,208,0.15)",
    means: "steps after a reset threw accumulated gradients away unused",
  },
  untrained_params: {
    label: "untrained parameters", color: "#4dd4e0", band: "rgba(77,212,224,0.12)",
    means: "parameters that get gradients no optimizer applies",
  },
  idle_optimizer: {
    label: "idle optimizer", color: "#d4d45a", band: "rgba(212,212,90,0.12)",
    means: "an optimizer that steps without any gradient to apply",
  },
};
/** The finding kinds named here (a test holds them to the wire's FindingKind). */
export const KNOWN_KINDS = Object.keys(FINDING_KINDS);
const OTHER_KIND = { color: "#f26d6d", band: "rgba(242,109,109,0.12)", means: "a finding" };

/** Label, colour, band fill and meaning of a finding kind (unknown kinds get a fallback). */
export function findingKind(kind) {
  return FINDING_KINDS[kind] || { ...OTHER_KIND, label: String(kind).replace(/_/g, " ") };
}

/** What a finding's `optimizer` field reads as ("(none)": no optimizer holds the params). */
export function optimizerText(name) {
  return name === "(none)" ? "no optimizer" : String(name);
}

/**
 * Reset kinds (Reset.how) -> the label used everywhere (strip, readout, hover), its strip
 * colour and a sentence. The labels read as the call that made the reset.
 */
export const RESET_KINDS = {
  optimizer_zero_grad: { label: "opt.zero_grad()", color: "#5aa9ff",
    says: "reset by optimizer.zero_grad()" },
  module_zero_grad: { label: "model.zero_grad()", color: "#3fb950",
    says: "reset by model.zero_grad()" },
  set_none: { label: "grad = None", color: "#8b96a3", says: "reset by p.grad = None" },
  zero_: { label: "grad.zero_()", color: "#e3a13b", says: "reset by p.grad.zero_()" },
  replaced: { label: "grad replaced", color: "#b58cff", says: "p.grad replaced by another tensor" },
};

/** Label of a reset kind ("opt.zero_grad()"); an unknown kind reads as sent. */
export function resetLabel(how, optName = null) {
  // optimizer.zero_grad() resets are named after the run's one optimizer as its findings
  // name it ("d_opt.zero_grad()")
  if (how === "optimizer_zero_grad" && optName) return `${optName}.zero_grad()`;
  return RESET_KINDS[how] ? RESET_KINDS[how].label : String(how);
}

/** Per finding kind, the role of the line to change first (gradwatch.locations). */
const PRIMARY_ROLE = {
  late_reset: ["reset"],
  missed_reset: ["reset", "backward"],
  discarded_accumulation: ["reset"],
  cross_optimizer_leak: ["backward"],
};
const FALLBACK_ORDER = ["step", "reset", "backward"];

/** The `where` entry a finding points at, or null when it has none. */
export function primaryWhere(f) {
  const where = f.where || [];
  const roles = PRIMARY_ROLE[f.kind] || [];
  for (const role of [...roles, ...FALLBACK_ORDER]) {
    const w = where.find((x) => x.role === role);
    if (w) return w;
  }
  return where[0] || null;
}

/**
 * "train.py:12": the file's last path component and the line. The server cannot know the
 * user's working directory, so the full path is left to a tooltip and the details.
 */
export function whereAt(w) {
  const file = String(w.file || "?");
  // a notebook cell, as IPython names it (gradwatch/locations.py: at)
  if (file.startsWith("Cell In[")) return `${file}, line ${w.line}`;
  const base = file.split(/[\\/]/).filter(Boolean).pop() || file;
  return `${base}:${w.line}`;
}
