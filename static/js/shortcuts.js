// Keyboard shortcuts on every page: "/" puts the cursor in the page's search box (the element marked
// aria-keyshortcuts="/": job names on the job list, metrics on a dashboard), "?" shows the list of shortcuts,
// Escape closes it. Keys typed into a field are the field's, never a shortcut.
(function () {
  "use strict";
  const SHORTCUTS = [
    ["/", "search this page (job names on the job list, metrics on a dashboard)"],
    ["?", "show these shortcuts"],
    ["Esc", "close this help, or leave a search box"],
  ];

  function typing(target) {
    return Boolean(target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName)));
  }

  function make(tag, props, ...children) {
    const node = document.createElement(tag);
    Object.assign(node, props || {});
    node.append(...children);
    return node;
  }

  let dialog = null;
  function showHelp() {
    if (!dialog) {
      const list = make("dl", {}, ...SHORTCUTS.flatMap(([key, what]) => [make("dt", {}, make("kbd", { textContent: key })),
        make("dd", { textContent: what })]));
      const close = make("button", { type: "button", className: "btn small", textContent: "Close" });
      close.addEventListener("click", () => dialog.close());
      dialog = make("dialog", { className: "shortcuts", id: "shortcuts-help" },
        make("h2", { textContent: "Keyboard shortcuts" }), list, close);
      dialog.setAttribute("aria-label", "Keyboard shortcuts");
      document.body.append(dialog);
    }
    if (!dialog.open) dialog.showModal();
  }

  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && typing(event.target) && event.target.matches('[aria-keyshortcuts~="/"]')) {
      event.target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented || typing(event.target)) return;
    if (event.key === "/") {
      const box = document.querySelector('[aria-keyshortcuts~="/"]');
      if (!box) return;
      event.preventDefault(); // not typed into the box it focuses
      box.focus();
      if (typeof box.select === "function") box.select();
    } else if (event.key === "?") {
      event.preventDefault();
      showHelp();
    }
  });
})();
