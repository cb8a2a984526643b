// Small DOM helpers shared by the UI modules.

export const $ = (id) => document.getElementById(id);

/** A DOM element: `attrs.text` sets its text; other attrs become attributes. */
export function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else if (value !== null && value !== undefined && value !== false) {
      node.setAttribute(key, value === true ? "" : value);
    }
  }
  node.append(...children);
  return node;
}

/** Whether a key press in `target` is typing (so page shortcuts must leave it alone). */
export function isTyping(target) {
  return Boolean(target?.closest?.("textarea, input, select, [contenteditable=true]"));
}

/** One line of `text`, at most `max` characters. */
export function snippet(text, max = 60) {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

/** Scrolls `scroller` (not the page) so that `item` is inside it. */
export function keepInView(scroller, item) {
  const outer = scroller.getBoundingClientRect();
  const inner = item.getBoundingClientRect();
  if (inner.top < outer.top) scroller.scrollTop -= outer.top - inner.top + 4;
  else if (inner.bottom > outer.bottom) scroller.scrollTop += inner.bottom - outer.bottom + 4;
}

/** `fn` once calls stop for `ms` milliseconds. */
export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
