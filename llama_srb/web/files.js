// Files in and out: a download made in the page, and a tree read from a chosen file.

import { el } from "./dom.js";
import * as Tree from "./tree.js";

export function download(name, content, type) {
  const url = URL.createObjectURL(new Blob([content], { type }));
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** The tree in `file`; throws an Error that says what is wrong with it. */
export async function readTree(file) {
  return Tree.fromJSON(JSON.parse(await file.text()));
}
