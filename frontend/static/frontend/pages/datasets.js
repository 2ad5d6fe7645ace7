/* Datasets page: an upload form with no file chosen is answered here, under the file field, instead of
 * sending an empty request the API could only answer about the missing URI. */
(function () {
  "use strict";

  document.addEventListener("submit", (event) => {
    const form = event.target.closest('form[data-form="upload"]');
    if (!form) return;
    const input = form.querySelector('input[type="file"]');
    if (input && input.files && input.files.length) return;
    event.preventDefault();
    event.stopImmediatePropagation();
    window.Fleetyard.clearErrors(form);
    window.Fleetyard.showErrors(form, { body: { file: ["choose a file to upload"] } });
  }, true);
})();
