/* Fleetyard console: the few browser behaviours every page shares.
 *
 * The console's pages are rendered by Django; every action goes through the REST API (/api/v1/) with
 * the session cookie and the CSRF token, so the console and the API validate and act identically.
 *
 *  - <form data-api="/api/v1/..." [data-method="POST"] [data-redirect="/jobs/{id}/"] [data-reload]
 *         [data-multipart] [data-confirm="..."] [data-done="Saved."]>
 *      submitted as JSON (or multipart), fields named "a.b" become nested objects; an input's
 *      data-type ("int", "float", "list", "json", "bool") converts its value; empty optional fields
 *      are left out. A 4xx shows each field's reason under the field (and the rest at the top).
 *      While in flight the submit button says what is happening and cannot be pressed twice.
 *  - <button data-api="/api/v1/.../cancel/" data-method="POST" [data-body='{"reason": ""}']
 *           [data-confirm="..."] [data-reload] [data-redirect="/jobs/"]>
 *  - Live regions use htmx (hx-get + hx-select + hx-trigger="every 3s").
 *  - Fleetyard.chart(el, option) makes an ECharts chart that follows its container's size.
 *  - Fleetyard.streamLines(url, onItem, {signal}) reads an NDJSON stream (logs with follow=true).
 *  - Fleetyard.streamEvents(url, body, onEvent, {signal}) POSTs and reads server-sent events.
 */
(function () {
  "use strict";

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    if (meta && meta.content) return meta.content;
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  class ApiError extends Error {
    constructor(status, body) {
      super(ApiError.summary(status, body));
      this.status = status;
      this.body = body || {};
    }

    static summary(status, body) {
      if (body && typeof body === "object") {
        if (typeof body.detail === "string") return body.detail;
        if (Array.isArray(body.detail)) return body.detail.join(" ");
        const parts = [];
        for (const [field, reasons] of Object.entries(body)) {
          parts.push(`${field}: ${[].concat(reasons).map(flatten).join(" ")}`);
        }
        if (parts.length) return parts.join("; ");
      }
      if (status === 0) return "the server did not answer; check your connection and try again";
      return `the server answered ${status}`;
    }
  }

  function flatten(value) {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      return Object.entries(value).map(([k, v]) => `${k}: ${[].concat(v).map(flatten).join(" ")}`).join("; ");
    }
    return String(value);
  }

  async function api(url, { method = "GET", body, form } = {}) {
    const headers = { Accept: "application/json" };
    const init = { method, headers, credentials: "same-origin" };
    if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
    if (form) {
      init.body = form;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      throw new ApiError(0, null);
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (err) { data = { detail: text.slice(0, 300) }; }
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  function convert(input, raw) {
    const kind = input.dataset.type;
    if (kind === "int" || kind === "float") {
      const n = kind === "int" ? Number.parseInt(raw, 10) : Number.parseFloat(raw);
      return Number.isNaN(n) ? raw : n;  // the API names the field and the reason
    }
    if (kind === "list") return raw.split(/[,\n]/).map((s) => s.trim()).filter(Boolean);
    if (kind === "bool") return raw === "true" || raw === "on" || raw === "1";
    if (kind === "json") {
      try { return JSON.parse(raw); } catch (err) { return raw; }
    }
    return raw;
  }

  function setPath(target, path, value) {
    const keys = path.split(".");
    let node = target;
    keys.slice(0, -1).forEach((key) => {
      if (typeof node[key] !== "object" || node[key] === null) node[key] = {};
      node = node[key];
    });
    node[keys[keys.length - 1]] = value;
  }

  /* The form's fields as the API's JSON body. */
  function formBody(form) {
    const body = {};
    const lists = {};
    for (const input of form.elements) {
      if (!input.name || input.disabled || input.dataset.skip !== undefined) continue;
      if (input.type === "submit" || input.type === "button" || input.type === "file") continue;
      if (input.type === "checkbox") {
        if (input.dataset.type === "bool") { setPath(body, input.name, input.checked); continue; }
        lists[input.name] = lists[input.name] || [];
        if (input.checked) lists[input.name].push(input.value);
        continue;
      }
      if (input.type === "radio" && !input.checked) continue;
      if (input.tagName === "SELECT" && input.multiple) {
        lists[input.name] = Array.from(input.selectedOptions).map((o) => o.value);
        continue;
      }
      const raw = input.value.trim() === "" && input.tagName !== "TEXTAREA" ? "" : input.value;
      if (raw === "" && !input.required && input.dataset.keepEmpty === undefined) continue;
      setPath(body, input.name, convert(input, raw));
    }
    for (const [name, values] of Object.entries(lists)) setPath(body, name, values);
    return body;
  }

  function clearErrors(form) {
    form.querySelectorAll(".field-error").forEach((el) => el.remove());
    form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
    const box = form.querySelector(".form-errors");
    if (box) { box.textContent = ""; box.hidden = true; }
  }

  function fieldFor(form, name) {
    return form.querySelector(`[name="${CSS.escape(name)}"]`);
  }

  /* Each field's reasons under its input; anything without an input in the form's error box. */
  function showErrors(form, error) {
    const rest = [];
    const place = (prefix, value) => {
      for (const [field, reasons] of Object.entries(value)) {
        const name = prefix ? `${prefix}.${field}` : field;
        if (reasons && typeof reasons === "object" && !Array.isArray(reasons)) { place(name, reasons); continue; }
        const input = fieldFor(form, name);
        const text = [].concat(reasons).map(flatten).join(" ");
        if (input && field !== "detail") {
          input.setAttribute("aria-invalid", "true");
          const note = document.createElement("div");
          note.className = "field-error";
          note.setAttribute("role", "alert");
          note.textContent = text;
          (input.closest("label, .field") || input).after(note);
        } else {
          rest.push(field === "detail" || field === "non_field_errors" || field === "spec" ? text : `${name}: ${text}`);
        }
      }
    };
    if (error.body && typeof error.body === "object" && Object.keys(error.body).length) {
      const { errors, ...fields } = error.body;  // spec apply repeats its lines in `errors`
      place("", fields);
    } else {
      rest.push(error.message);
    }
    const box = form.querySelector(".form-errors") || form.insertBefore(document.createElement("div"), form.firstChild);
    box.classList.add("form-errors");
    box.setAttribute("role", "alert");
    box.hidden = rest.length === 0;
    box.textContent = "";
    rest.forEach((line) => { const p = document.createElement("div"); p.textContent = line; box.appendChild(p); });
    const first = form.querySelector("[aria-invalid]") || box;
    if (first && first.focus) first.focus();
  }

  function busy(button, on, label) {
    if (!button) return;
    if (on) {
      button.dataset.idleLabel = button.textContent;
      button.textContent = label || "Working…";
      button.disabled = true;
      button.setAttribute("aria-busy", "true");
    } else {
      button.textContent = button.dataset.idleLabel || button.textContent;
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }

  // A form's named controls shadow its built-in properties (a field named "dataset" would hide
  // form.dataset), so read data- attributes through the prototype's getter.
  const DATASET = Object.getOwnPropertyDescriptor(HTMLElement.prototype, "dataset").get;
  function attrs(el) { return DATASET.call(el); }

  function afterSuccess(el, data) {
    const redirect = attrs(el).redirect;
    if (redirect) {
      window.location.assign(redirect.replace("{id}", data && data.id !== undefined ? data.id
        : (data && data.object ? data.object.id : "")));
      return;
    }
    if (attrs(el).reload !== undefined) { window.location.reload(); return; }
    if (attrs(el).done) flash(attrs(el).done, "success");
    el.dispatchEvent(new CustomEvent("fy:done", { detail: data, bubbles: true }));
  }

  function flash(text, tone) {
    let list = document.querySelector(".messages");
    if (!list) {
      list = document.createElement("ul");
      list.className = "messages";
      const page = document.querySelector("main.page");
      page.insertBefore(list, page.firstChild);
    }
    const item = document.createElement("li");
    item.className = `message ${tone || "info"}`;
    item.setAttribute("role", "status");
    item.textContent = text;
    list.appendChild(item);
  }

  async function submitForm(event) {
    const form = event.target.closest("form[data-api]");
    if (!form) return;
    event.preventDefault();
    if (attrs(form).confirm && !window.confirm(attrs(form).confirm)) return;
    clearErrors(form);
    const button = event.submitter || form.querySelector('[type="submit"]');
    busy(button, true, attrs(form).busy);
    try {
      const method = (attrs(form).method || "POST").toUpperCase();
      const url = button && button.dataset.api ? button.dataset.api : attrs(form).api;
      const data = attrs(form).multipart !== undefined
        ? await api(url, { method, form: new FormData(form) })
        : await api(url, { method, body: formBody(form) });
      afterSuccess(form, data);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      showErrors(form, error);
    } finally {
      busy(button, false);
    }
  }

  async function clickAction(event) {
    const button = event.target.closest("button[data-api]");
    if (!button || button.form && attrs(button.form).api !== undefined) return;
    event.preventDefault();
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    busy(button, true, button.dataset.busy);
    try {
      const body = button.dataset.body ? JSON.parse(button.dataset.body) : undefined;
      const data = await api(button.dataset.api, { method: (button.dataset.method || "POST").toUpperCase(), body });
      afterSuccess(button, data);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      flash(error.message, "error");
    } finally {
      busy(button, false);
    }
  }

  /* Text made safe for the HTML of an ECharts tooltip or label formatter. */
  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  /* 8 -> "8", 7.25 -> "7.3": device counts are whole, fractional shares get one decimal. */
  function formatNumber(n) {
    return Number.isInteger(n) ? String(n) : n.toFixed(1);
  }

  function chart(el, option) {
    if (!window.echarts) return null;
    const existing = window.echarts.getInstanceByDom(el);
    const instance = existing || window.echarts.init(el, null, { renderer: "canvas" });
    instance.setOption(Object.assign({ animation: false, textStyle: { fontFamily: "system-ui, sans-serif" } }, option),
      { notMerge: true });
    if (!existing && window.ResizeObserver) new ResizeObserver(() => instance.resize()).observe(el);
    el.dataset.chartReady = "true";
    return instance;
  }

  /* Read a response body as text records cut at `separator`, calling onRecord(text) for each; a record
   * for which onRecord returns false ends the reading. */
  async function readRecords(response, separator, onRecord) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf(separator)) >= 0) {
        const record = buffer.slice(0, cut);
        buffer = buffer.slice(cut + separator.length);
        if (onRecord(record) === false) { reader.cancel(); return; }
      }
    }
    if (buffer.trim()) onRecord(buffer);
  }

  /* Read an NDJSON stream, calling onItem for each object; resolves when the stream ends. */
  async function streamLines(url, onItem, { signal } = {}) {
    // DRF negotiates the Accept header before a streaming view runs: offer JSON too, or it answers 406.
    const headers = { Accept: "application/x-ndjson, application/json;q=0.9" };
    const response = await fetch(url, { credentials: "same-origin", headers, signal });
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch (err) { body = null; }
      throw new ApiError(response.status, body);
    }
    await readRecords(response, "\n", (line) => { if (line.trim()) onItem(JSON.parse(line)); });
  }

  /* POST a JSON body and read server-sent events (`data: {...}` ... `data: [DONE]`). */
  async function streamEvents(url, body, onEvent, { signal } = {}) {
    const response = await fetch(url, {
      method: "POST", credentials: "same-origin", signal,
      headers: { "Content-Type": "application/json", Accept: "text/event-stream", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      let data = null;
      try { data = await response.json(); } catch (err) { data = null; }
      const message = data && data.error ? data.error.message : null;
      throw new ApiError(response.status, message ? { detail: message, param: data.error.param } : data);
    }
    await readRecords(response, "\n\n", (block) => {
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) return true;
      if (data === "[DONE]") return false;
      onEvent(JSON.parse(data));
      return true;
    });
  }

  document.addEventListener("submit", submitForm);
  document.addEventListener("click", clickAction);
  // htmx: keep the CSRF token on its requests too (live regions only GET, but be safe).
  document.addEventListener("htmx:configRequest", (event) => { event.detail.headers["X-CSRFToken"] = csrfToken(); });

  window.Fleetyard = { api, ApiError, chart, escapeHtml, formatNumber, flash, formBody, streamLines, streamEvents, showErrors, clearErrors };
})();
