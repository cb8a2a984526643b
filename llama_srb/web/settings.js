// Generation settings: declared once here; the form, the story's saved settings (the
// form's raw values, kept with each story) and the request body all come from this list.
// Defaults are the server's (llama.cpp's), except n and max_tokens.

import { el } from "./dom.js";

const GROUPS = [
  {
    legend: "Length",
    fields: [
      // 256 is the most any server allows; the server's own limit is learned from its answer.
      { key: "n", label: "n (continuations)", min: 1, max: 256, step: 1, value: "4" },
      { key: "max_tokens", label: "max tokens", min: 1, max: 8192, step: 1, value: "48" },
    ],
  },
  {
    legend: "Sampling",
    fields: [
      { key: "temperature", label: "temperature", min: 0, max: 5, step: 0.05, value: "0.8" },
      { key: "top_p", label: "top-p", min: 0, max: 1, step: 0.01, value: "0.95" },
      { key: "min_p", label: "min-p", min: 0, max: 1, step: 0.01, value: "0.05" },
      { key: "top_k", label: "top-k (0: off)", min: 0, step: 1, value: "40" },
    ],
  },
  {
    legend: "Repetition",
    fields: [
      { key: "repeat_penalty", label: "repeat penalty", min: 0, max: 10, step: 0.01, value: "1" },
      {
        key: "dry_multiplier", label: "DRY multiplier (0: off)",
        min: 0, max: 100, step: 0.05, value: "0",
      },
      { key: "dry_base", label: "DRY base", min: 1, max: 100, step: 0.05, value: "1.75" },
      { key: "dry_allowed_length", label: "DRY allowed length", min: 0, step: 1, value: "2" },
    ],
  },
  {
    legend: "XTC",
    fields: [
      {
        key: "xtc_probability", label: "XTC probability (0: off)",
        min: 0, max: 1, step: 0.01, value: "0",
      },
      { key: "xtc_threshold", label: "XTC threshold", min: 0, max: 1, step: 0.01, value: "0.1" },
    ],
  },
  {
    // Choosing between branches (docs/design.md): the n continuations open and sound differently.
    legend: "Choosing",
    fields: [
      {
        key: "best_of", label: "best of (decode more, keep the n likeliest)",
        min: 1, max: 256, step: 1, value: "",
      },
      {
        // Not a request field: it becomes per-branch temperatures (choices_params).
        key: "spread", label: "temperature spread (± across the n)",
        min: 0, max: 5, step: 0.05, value: "0", zeroIsOff: true, local: true,
      },
      { key: "distinct_openings", label: "distinct openings", checkbox: true, value: "" },
      {
        key: "banned_strings", label: "banned phrases, one per line",
        multiline: true, value: "",
      },
      {
        // RE2 patterns (docs/api.md, Banned patterns), sent as typed: a pattern has its own
        // escapes (\b, \w), so "\n" is not turned into a newline here.
        key: "banned_regex", label: "banned patterns (RE2), one per line",
        multiline: true, raw: true, value: "",
      },
    ],
  },
  {
    legend: "Words",
    fields: [
      {
        // Asks for logprobs: each word then shows its probability and its alternatives.
        key: "logprobs", label: "alternatives per word (0: off)",
        min: 0, max: 20, step: 1, value: "0", zeroIsOff: true,
      },
    ],
  },
  {
    legend: "Other",
    fields: [
      { key: "seed", label: "seed (empty: random)", min: 0, step: 1, value: "" },
      {
        key: "stop", label: "stop strings, one per line (\\n = newline)",
        multiline: true, value: "",
      },
    ],
  },
];

const FIELDS = GROUPS.flatMap((g) => g.fields);

/** The form's raw values for a new story. */
export function defaults() {
  return Object.fromEntries(FIELDS.map((f) => [f.key, f.value]).filter(([, v]) => v !== ""));
}

/** Fills `form` with the fields, at their defaults; `onChange(values)` hears every edit. */
export function buildForm(form, onChange) {
  const values = defaults();
  for (const group of GROUPS) {
    const set = el("fieldset", {}, [el("legend", { text: group.legend })]);
    for (const field of group.fields) set.append(fieldFor(field, values[field.key]));
    form.append(set);
  }
  form.addEventListener("input", (event) => {
    clearError(form, event.target.name);
    onChange(readForm(form));
  });
  form.addEventListener("submit", (e) => e.preventDefault());
}

/** Shows a story's saved raw values (missing ones at their defaults). */
export function fill(form, values) {
  const all = { ...defaults(), ...values };
  for (const field of FIELDS) {
    const input = form.elements.namedItem(field.key);
    if (!input) continue;
    if (field.checkbox) input.checked = Boolean(all[field.key]);
    else input.value = all[field.key] ?? "";
    clearError(form, field.key);
  }
}

function fieldFor(field, value) {
  const attrs = { name: field.key, id: `setting-${field.key}`, "data-testid": `setting-${field.key}` };
  if (field.checkbox) {
    const box = el("input", { ...attrs, type: "checkbox" });
    box.checked = Boolean(value);
    return el("label", { class: "field check" }, [box, field.label]);
  }
  const input = field.multiline
    ? el("textarea", { ...attrs, rows: "2", spellcheck: "false" })
    : el("input", { ...attrs, type: "number", inputmode: "decimal", step: field.step });
  if (field.min !== undefined && !field.multiline) input.min = field.min;
  if (field.max !== undefined) input.max = field.max;
  input.value = value ?? "";
  const error = el("span", {
    class: "field-error", id: `error-${field.key}`, "data-testid": "setting-error", hidden: true,
  });
  input.setAttribute("aria-describedby", error.id);
  return el("label", { class: field.multiline ? "field wide" : "field" }, [field.label, input, error]);
}

export function readForm(form) {
  return Object.fromEntries(new FormData(form).entries());
}

/** Puts raw saved values (a node's settings, say) back into the form. */
export function writeForm(form, values) {
  for (const field of FIELDS) {
    const input = form.elements.namedItem(field.key);
    if (!input) continue;
    const value = field.key === "spread" ? spreadOf(values.choices_params) : values[field.key];
    if (field.checkbox) input.checked = Boolean(value);
    else if (field.multiline) input.value = (value ?? []).map(field.raw ? String : escape).join("\n");
    else input.value = value ?? (field.zeroIsOff ? "0" : "");
    clearError(form, field.key);
  }
}

/** The first setting that is not a number or out of range. A value off the spinner's step
 * (top-p 0.925, say) is fine: `step` only sets how far the arrows move. */
export function invalidField(form) {
  return [...form.elements].find(({ validity: v }) =>
    v && (v.badInput || v.rangeUnderflow || v.rangeOverflow),
  );
}

/** The request fields for the form's raw string values; empty numbers are left to the server. */
export function requestFields(values) {
  const body = {};
  for (const field of FIELDS) {
    const raw = String(values[field.key] ?? "");
    if (field.local) continue;
    if (field.checkbox) {
      if (raw) body[field.key] = true;
    } else if (field.multiline) {
      // Not trimmed: a stop string may start or end with a space.
      const lines = raw.split("\n").filter((s) => s !== "").map(field.raw ? String : unescape);
      if (lines.length) body[field.key] = lines;
    } else if (raw.trim() !== "" && !(field.zeroIsOff && Number(raw) === 0)) {
      body[field.key] = Number(raw);
    }
  }
  const spread = spreadTemperatures(
    body.temperature ?? 0.8, Number(values.spread ?? 0), body.best_of ?? body.n ?? 1,
  );
  if (spread) body.choices_params = spread.map((temperature) => ({ temperature }));
  return body;
}

/** Per-branch temperatures for a spread s around the temperature t: from t - s for the
 * first branch to t + s for the last, evenly (never below 0). */
export function spreadTemperatures(t, s, n) {
  if (!(s > 0) || !(n > 1)) return null;
  return Array.from({ length: n }, (_, i) => {
    const value = t - s + (2 * s * i) / (n - 1);
    return Math.max(0, Math.round(value * 1000) / 1000);
  });
}

function spreadOf(choicesParams) {
  const temps = (choicesParams ?? []).map((p) => p?.temperature).filter((t) => t !== undefined);
  return temps.length > 1 ? String((Math.max(...temps) - Math.min(...temps)) / 2) : "0";
}

/** The field a server error is about: its `param`, else a setting its message names (only
 * names that cannot be ordinary words, such as dry_base; not n, seed or stop). */
export function fieldOfError(form, error) {
  if (error.param) return form.elements.namedItem(error.param) ? error.param : null;
  const named = FIELDS.find(
    (f) => /_|temperature|logprobs/.test(f.key) && new RegExp(`\\b${f.key}\\b`).test(error.message),
  );
  return named?.key ?? null;
}

/** Marks the field `key` with `message`, opening the settings so the writer sees it. When
 * the server states the field's range ("n must be between 1 and 64"), the form takes it. */
export function markError(form, key, message) {
  const input = form.elements.namedItem(key);
  if (!input) return;
  const range = message.match(/between (-?[\d.]+) and (-?[\d.]+)/);
  if (range && !input.matches("textarea")) {
    input.min = range[1];
    input.max = range[2];
  }
  input.setAttribute("aria-invalid", "true");
  const error = document.getElementById(`error-${key}`);
  if (error) {
    error.textContent = message;
    error.hidden = false;
  }
  form.closest("details")?.setAttribute("open", "");
}

function clearError(form, key) {
  const input = key && form.elements.namedItem(key);
  if (!input) return;
  input.removeAttribute("aria-invalid");
  const error = document.getElementById(`error-${key}`);
  if (error) error.hidden = true;
}

export function clearErrors(form) {
  for (const field of FIELDS) clearError(form, field.key);
}

// Stop strings are often "\n" or "\n\n", which a text box cannot show: write them escaped.
function unescape(s) {
  return s.replace(/\\([nt\\])/g, (_, c) => ({ n: "\n", t: "\t", "\\": "\\" })[c]);
}

function escape(s) {
  return s.replace(/[\\\n\t]/g, (c) => ({ "\n": "\\n", "\t": "\\t", "\\": "\\\\" })[c]);
}
