// Form fields with labels, hints and an error slot each, and showing the
// API's errors next to the field they name.

import { h } from "./dom.js";

// field builds a labelled input: {name, label, type, value, hint, attrs,
// apiField (the API's name for it, if another), options (for a select)}.
export function field({ name, label, type = "text", value, hint, attrs = {}, apiField, options, wide, id }) {
  const fid = id || `f-${name}`;
  const hintID = hint ? `${fid}-hint` : null;
  const errID = `${fid}-error`;
  const common = Object.assign({
    id: fid, name, "aria-describedby": [hintID, errID].filter(Boolean).join(" "),
    dataset: { field: apiField || name },
  }, attrs);
  let input;
  if (options) {
    input = h("select", common, options.map(([v, text]) => h("option", { value: v, selected: String(v) === String(value) }, text)));
  } else if (type === "textarea") {
    input = h("textarea", Object.assign({ rows: 3 }, common), value ?? "");
  } else {
    input = h("input", Object.assign({ type, value: value ?? "" }, common));
  }
  return h("div", { class: wide ? "field wide" : "field" },
    h("label", { for: fid }, label),
    input,
    hint ? h("p", { class: "hint", id: hintID }, hint) : null,
    h("p", { class: "field-error", id: errID, "aria-live": "polite" }));
}

// formError is the slot for errors that name no field.
export function formError(id) {
  return h("p", { class: "error", role: "alert", id });
}

// clearErrors empties a form's error slots.
export function clearErrors(form) {
  for (const el of form.querySelectorAll(".field-error, .error")) el.textContent = "";
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
}

// showError puts err beside the field it names (the API's `field`, or
// a field's own name), focusing it; otherwise in the form's error slot.
export function showError(form, err, fieldName) {
  const name = fieldName || (err && err.field) || "";
  const msg = (err && err.message) || String(err);
  let input = null;
  if (name) {
    input = form.querySelector(`[data-field="${CSS.escape(name)}"]`) || form.querySelector(`[name="${CSS.escape(name)}"]`);
  }
  if (input) {
    const slot = document.getElementById(`${input.id}-error`);
    if (slot) {
      slot.textContent = msg;
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return;
    }
  }
  const slot = form.querySelector(".error");
  if (slot) slot.textContent = msg;
}

// busy disables a form's buttons while fn runs.
export async function busy(form, fn) {
  const buttons = [...form.querySelectorAll("button")];
  for (const b of buttons) b.disabled = true;
  form.setAttribute("aria-busy", "true");
  try {
    return await fn();
  } finally {
    for (const b of buttons) b.disabled = false;
    form.removeAttribute("aria-busy");
  }
}
