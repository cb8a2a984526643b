// Generation settings: declared once here; the form, local storage and the request body
// all come from this list. Defaults are the server's (llama.cpp's), except n and max_tokens.

const STORAGE_KEY = "llama-srb.settings";

export const GROUPS = [
  {
    legend: "Length",
    fields: [
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

export function loadSaved() {
  try {
    return JSON.parse(localStorage.getItem(STORAGE_KEY) ?? "{}") ?? {};
  } catch {
    return {}; // a corrupt entry must not break the page
  }
}

export function save(values) {
  localStorage.setItem(STORAGE_KEY, JSON.stringify(values));
}

export function defaults() {
  return Object.fromEntries(FIELDS.map((f) => [f.key, f.value]));
}

/** The request fields for the form's raw string values; empty numbers are left to the server. */
export function requestFields(values) {
  const body = {};
  for (const field of FIELDS) {
    const raw = String(values[field.key] ?? "");
    if (field.multiline) {
      // Not trimmed: a stop string may start or end with a space.
      const stops = raw.split("\n").filter((s) => s !== "").map(unescape);
      if (stops.length) body.stop = stops;
    } else if (raw.trim() !== "") {
      body[field.key] = Number(raw);
    }
  }
  return body;
}

// Stop strings are often "\n" or "\n\n", which a text box cannot show: write them escaped.
function unescape(s) {
  return s.replace(/\\([nt\\])/g, (_, c) => ({ n: "\n", t: "\t", "\\": "\\" })[c]);
}
