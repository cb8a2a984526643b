// A question with a few answers, in a modal <dialog>: for what cannot be undone quietly.

import { $, el } from "./dom.js";

/** Resolves to the value of the answer picked, or null when the dialog is dismissed. The
 * first answer has the focus. `answers`: [{value, label}]. */
export function ask(title, message, answers) {
  const dialog = $("ask");
  $("ask-title").textContent = title;
  $("ask-message").textContent = message;
  const buttons = answers.map(({ value, label }) =>
    el("button", { type: "button", value, "data-testid": `ask-${value}` }, [label]),
  );
  $("ask-answers").replaceChildren(...buttons);
  return new Promise((resolve) => {
    const done = (value) => {
      dialog.close();
      resolve(value);
    };
    for (const button of buttons) button.addEventListener("click", () => done(button.value));
    dialog.addEventListener("cancel", () => resolve(null), { once: true });
    dialog.showModal();
    buttons[0]?.focus();
  });
}
