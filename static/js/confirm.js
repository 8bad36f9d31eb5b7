// Forms marked data-confirm="question" ask before they submit (the CSP forbids inline onsubmit handlers).
// Delegated from the document, so forms htmx swaps in later (the job page's live panel) are covered too.
document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});
