/* Team settings: show a new API token's secret once (with a copy button), refresh the token list after
 * a token is created or revoked. The secret lives only in this page's memory; a reload forgets it. */
(function () {
  "use strict";

  function refresh(id) {
    const region = document.getElementById(id);
    if (region && window.htmx) window.htmx.trigger(region, "refresh");
  }

  document.addEventListener("fy:done", (event) => {
    const form = event.target.closest("form.create-token");
    if (form) {
      const box = form.querySelector(".secret-box");
      box.querySelector(".secret-value").textContent = event.detail && event.detail.token ? event.detail.token : "";
      box.hidden = false;
      const copy = box.querySelector(".copy-secret");
      copy.textContent = "Copy";
      form.querySelectorAll('input[name="name"], input[name="expires_at"]').forEach((input) => { input.value = ""; });
      window.Fleetyard.flash(`Token ${event.detail.name} created for team ${event.detail.team}.`, "success");
      refresh(form.dataset.refresh);
      return;
    }
    const list = event.target.closest(".token-list");
    if (list) refresh(list.id);
  });

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button.copy-secret");
    if (!button) return;
    const code = button.closest(".secret-row").querySelector(".secret-value");
    const selectIt = () => {
      const range = document.createRange();
      range.selectNodeContents(code);
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
    };
    const done = (label) => { button.textContent = label; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(code.textContent).then(() => done("Copied"), () => { selectIt(); done("Selected: press Ctrl+C"); });
    } else {
      selectIt();
      done("Selected: press Ctrl+C");
    }
  });
})();
