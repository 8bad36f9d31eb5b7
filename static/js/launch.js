// The launch form shows a field only where it applies. Which fields depend on which is not written here: each
// field's box carries its rule, rendered from the schema (trainer/config.py's `Web.show_if` for a setting,
// webapp/jobs/forms.py's SHOW_IF for the fields written there) as data-show-if='{"field": ["value", "!other"]}':
// shown when, for every field named, its value is one of the values listed ("!v": any value but v). A hidden
// field keeps its value and is still posted (the server ignores what does not apply).
(function () {
  "use strict";
  const form = document.querySelector("form.launch");
  if (!form) return;
  const value = (name) => {
    const field = form.elements[name];
    return field ? field.value : "";
  };
  const matches = (name, values) =>
    values.some((v) => (v.startsWith("!") ? value(name) !== v.slice(1) : value(name) === v));
  const boxes = Array.from(form.querySelectorAll("[data-show-if]")).map((box) => ({
    box,
    rule: Object.entries(JSON.parse(box.dataset.showIf)),
  }));
  function apply() {
    for (const { box, rule } of boxes) {
      const shown = rule.every(([name, values]) => matches(name, values));
      // A box with an error stays in view, so the user can see what to fix.
      const erring = box.classList.contains("has-error") || box.querySelector(".has-error") !== null;
      box.hidden = !shown && !erring;
    }
  }
  form.addEventListener("change", apply);
  apply();
})();
