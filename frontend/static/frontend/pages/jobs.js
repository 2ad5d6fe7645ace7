/* Training job pages: the submit page (form / YAML tabs, dry-run plan) and a job's page (live logs that
 * follow the run, loss and throughput charts). Every action goes through the REST API (console.js). */
(function () {
  "use strict";

  const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED"];
  const MAX_LOG_LINES = 5000;
  const METRICS_EVERY_MS = 3000;
  const FOLLOW_DELAY_MS = 1500;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, value === true ? "" : value);
    }
    children.flat().forEach((child) => {
      if (child === null || child === undefined || child === false) return;
      node.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
    });
    return node;
  }

  // ------------------------------------------------------------------------------------------ submit page

  function setupTabs() {
    const tabs = Array.from(document.querySelectorAll('.tabs [role="tab"]'));
    const show = (tab) => {
      tabs.forEach((t) => {
        const selected = t === tab;
        t.setAttribute("aria-selected", selected ? "true" : "false");
        t.tabIndex = selected ? 0 : -1;
        document.getElementById(t.getAttribute("aria-controls")).hidden = !selected;
      });
      const url = new URL(window.location.href);
      url.searchParams.set("tab", tab.id === "tab-yaml" ? "yaml" : "form");
      window.history.replaceState(null, "", url);
    };
    tabs.forEach((tab, i) => {
      tab.tabIndex = tab.getAttribute("aria-selected") === "true" ? 0 : -1;
      tab.addEventListener("click", () => show(tab));
      tab.addEventListener("keydown", (event) => {
        if (event.key !== "ArrowRight" && event.key !== "ArrowLeft") return;
        const next = tabs[(i + (event.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
        next.focus();
        show(next);
      });
    });
  }

  function setupJobForm(form) {
    const team = form.querySelector("[data-team-select]");
    const queue = form.querySelector("[data-queue-select]");
    const dataset = form.querySelector('select[name="dataset"]');
    const trainer = form.querySelector("[data-trainer-select]");

    const pickTeam = () => {
      if (!team) return;
      for (const select of [queue, dataset]) {
        if (!select) continue;
        let firstOk = null;
        Array.from(select.options).forEach((option) => {
          if (option.dataset.team === undefined) return;  // "none"
          const ok = option.dataset.team === team.value;
          option.disabled = !ok;
          option.hidden = !ok;
          if (ok && !firstOk) firstOk = option;
        });
        const current = select.selectedOptions[0];
        if (current && current.disabled) {
          if (select === queue && firstOk) firstOk.selected = true;
          else select.value = "";
        }
      }
    };

    const pickQueue = () => {
      const option = queue && queue.selectedOptions[0];
      const key = option ? option.dataset.key : "";
      form.querySelectorAll(".type-option").forEach((row) => {
        const ok = (row.dataset.queues || "").split(" ").includes(key);
        row.hidden = !ok;
        const box = row.querySelector("input");
        box.disabled = !ok;
        if (!ok) box.checked = false;
      });
    };

    const pickTrainer = () => {
      const entrypoint = trainer && trainer.value === "entrypoint";
      form.querySelectorAll("[data-entrypoint-only]").forEach((field) => {
        field.hidden = !entrypoint;
        field.querySelectorAll("input").forEach((input) => { input.disabled = !entrypoint; });
      });
      // a command reads its own settings: the built-in trainer's hyperparameters are not sent for it
      form.querySelectorAll("[data-builtin-only]").forEach((field) => {
        field.hidden = entrypoint;
        field.querySelectorAll("input, textarea").forEach((input) => { input.disabled = entrypoint; });
      });
    };

    if (team) team.addEventListener("change", () => { pickTeam(); pickQueue(); });
    if (queue) queue.addEventListener("change", pickQueue);
    if (trainer) trainer.addEventListener("change", pickTrainer);
    pickTeam();
    pickQueue();
    pickTrainer();
  }

  function simulatedTypes() {
    const node = document.getElementById("simulated-types");
    try { return new Set(node ? JSON.parse(node.textContent) : []); } catch (err) { return new Set(); }
  }

  function money(value) {
    return value === null || value === undefined ? "price unknown" : `$${Number(value).toFixed(2)}/h`;
  }

  function simBadge() {
    return el("span", { class: "badge badge-sim", title: "logical chips on a CPU host: the work runs on CPU" }, "SIMULATED");
  }

  function renderPlan(box, data) {
    const plan = data.plan || {};
    const sim = simulatedTypes();
    const chosen = plan.chosen;
    const queue = plan.queue || {};
    box.textContent = "";
    box.appendChild(el("h3", null, `Plan for ${data.kind === "deployment" ? "deployment" : "training job"} `,
      el("code", null, plan.name || ""), " ", el("span", { class: "muted small" }, "dry run: nothing was created")));
    const kv = el("dl", { class: "kv" });
    const row = (label, ...value) => { kv.appendChild(el("dt", null, label)); kv.appendChild(el("dd", null, ...value)); };
    if (chosen) {
      row("Accelerator type", el("strong", { "data-plan-chosen": true }, chosen.accelerator_type),
        sim.has(chosen.accelerator_type) ? [" ", simBadge()] : null,
        chosen.fits_now ? el("span", { class: "badge tone-ok" }, "fits now") : el("span", { class: "badge tone-warn" }, "waits"));
      row("Why", chosen.reason);
      row("Cost", el("strong", null, money(chosen.cost_per_hour_usd)), " ", el("span", { class: "muted small" }, `for ${plan.members} ${data.kind === "deployment" ? "replica" : "worker"}(s)`));
    } else {
      row("Accelerator type", el("span", { class: "muted" }, "none of the accepted types is known"));
    }
    if (queue.position) {
      row("Queue", `position ${queue.position} in cluster queue ${queue.cluster_queue} (${queue.waiting_ahead} waiting ahead), admitted ${queue.admission}`);
    } else if (queue.local_queue) {
      row("Queue", `${queue.local_queue} → cluster queue ${queue.cluster_queue}`);
    }
    box.appendChild(kv);
    if ((plan.options || []).length) {
      const body = el("tbody");
      plan.options.forEach((o) => body.appendChild(el("tr", null,
        el("td", null, el("code", null, o.accelerator_type), sim.has(o.accelerator_type) ? [" ", simBadge()] : null),
        el("td", { class: "num" }, `${o.units} ${o.unit}`),
        el("td", { class: "num" }, money(o.cost_per_hour_usd)),
        el("td", { class: "num" }, o.quota_left === null ? "no cap" : String(o.quota_left)),
        el("td", null, o.fits_now ? "fits now" : o.why_not))));
      box.appendChild(el("table", { class: "table" },
        el("thead", null, el("tr", null, el("th", null, "Type"), el("th", { class: "num" }, "Needs"),
          el("th", { class: "num" }, "Cost"), el("th", { class: "num" }, "Quota left"), el("th", null, "Room"))), body));
    }
    [...(plan.notes || []), ...(data.warnings || [])].forEach((note) => box.appendChild(el("p", { class: "note" }, note)));
    box.hidden = false;
  }

  /* Select line `n` (1-based) of a textarea and scroll it into view. */
  function goToLine(textarea, n) {
    const lines = textarea.value.split("\n");
    const start = lines.slice(0, n - 1).reduce((sum, line) => sum + line.length + 1, 0);
    const end = start + (lines[n - 1] || "").length;
    textarea.focus();
    textarea.setSelectionRange(start, end);
    const lineHeight = parseFloat(getComputedStyle(textarea).lineHeight) || 18;
    textarea.scrollTop = Math.max(0, (n - 3) * lineHeight);
  }

  function setupSpecForm(form) {
    const textarea = form.querySelector('textarea[name="spec"]');
    const issues = form.querySelector(".spec-errors");
    const planBox = document.getElementById("spec-plan");

    const clear = () => {
      Fleetyard.clearErrors(form);
      issues.textContent = "";
      issues.hidden = true;
      textarea.removeAttribute("aria-invalid");
    };

    const showIssues = (error) => {
      const body = error.body || {};
      const lines = Array.isArray(body.spec) ? body.spec : null;
      if (!lines) { Fleetyard.showErrors(form, error); return; }
      const detail = Array.isArray(body.errors) ? body.errors : [];
      lines.forEach((text, i) => {
        const line = detail[i] && detail[i].line;
        const item = el("li", null, line ? el("a", { href: `#line-${line}`, "data-line": line }, text) : text);
        issues.appendChild(item);
      });
      issues.hidden = false;
      textarea.setAttribute("aria-invalid", "true");
      const first = detail.find((d) => d.line);
      if (first) goToLine(textarea, first.line);
    };

    issues.addEventListener("click", (event) => {
      const link = event.target.closest("a[data-line]");
      if (!link) return;
      event.preventDefault();
      goToLine(textarea, Number(link.dataset.line));
    });

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const button = event.submitter || form.querySelector('[type="submit"]');
      const dryRun = button && button.dataset.dryRun !== undefined;
      clear();
      if (!dryRun) planBox.hidden = true;
      const buttons = Array.from(form.querySelectorAll('[type="submit"]'));
      const label = button.textContent;
      buttons.forEach((b) => { b.disabled = true; });
      button.textContent = dryRun ? "Planning…" : "Submitting…";
      button.setAttribute("aria-busy", "true");
      try {
        const url = form.dataset.specApi + (dryRun ? "?dry_run=1" : "");
        const data = await Fleetyard.api(url, { method: "POST", body: { spec: textarea.value } });
        if (dryRun) { renderPlan(planBox, data); return; }
        const id = data.object && data.object.id;
        window.location.assign(data.kind === "deployment" ? `/deployments/${id}/` : `/jobs/${id}/`);
      } catch (error) {
        if (!(error instanceof Fleetyard.ApiError)) throw error;
        showIssues(error);
      } finally {
        buttons.forEach((b) => { b.disabled = false; });
        button.textContent = label;
        button.removeAttribute("aria-busy");
      }
    });
  }

  // ------------------------------------------------------------------------------------------- job page

  function jobState() {
    const head = document.getElementById("job-head");
    return head ? head.dataset.state : "";
  }

  function isLive() {
    return !TERMINAL.includes(jobState());
  }

  function setupLogs(page) {
    const pre = document.getElementById("job-logs");
    const empty = document.getElementById("logs-empty");
    const status = document.getElementById("logs-status");
    const workerSelect = document.getElementById("logs-worker");
    const bottom = document.getElementById("logs-bottom");
    const base = `${page.dataset.api}logs/`;
    let controller = null;
    let after = pre.dataset.after || "";
    let generation = 0;

    const atBottom = () => pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    const toBottom = () => { pre.scrollTop = pre.scrollHeight; bottom.hidden = true; };
    pre.addEventListener("scroll", () => { bottom.hidden = atBottom(); });
    bottom.addEventListener("click", toBottom);

    const append = (item) => {
      const stick = atBottom();
      const line = el("span", { class: "log-line" },
        item.worker !== null && item.worker !== undefined ? [el("span", { class: "log-worker" }, `[${item.worker}]`), " "] : null,
        item.line);
      pre.appendChild(line);
      pre.appendChild(document.createTextNode("\n"));
      while (pre.childNodes.length > MAX_LOG_LINES * 2) { pre.removeChild(pre.firstChild); }
      empty.hidden = true;
      after = item.id;
      if (stick) toBottom(); else bottom.hidden = false;
    };

    async function follow() {
      const mine = ++generation;
      for (;;) {
        controller = new AbortController();
        const params = new URLSearchParams({ follow: "true", timeout: "120" });
        if (after !== "") params.set("after", after);
        if (workerSelect.value !== "") params.set("worker", workerSelect.value);
        const wasLive = isLive();
        status.textContent = wasLive ? "following" : "";
        try {
          await Fleetyard.streamLines(`${base}?${params}`, (item) => { if (mine === generation) append(item); },
            { signal: controller.signal });
        } catch (error) {
          if (error && error.name === "AbortError") return;
          if (mine !== generation) return;
          status.textContent = `the log stream stopped (${error.message || error}); retrying`;
          await new Promise((resolve) => setTimeout(resolve, 3000));
          continue;
        }
        if (mine !== generation) return;
        // The stream ends when the job ends (or after its timeout): follow again only while it is live.
        if (!wasLive || !isLive()) { status.textContent = "the job ended; these are all its lines"; return; }
      }
    }

    workerSelect.addEventListener("change", () => {
      if (controller) controller.abort();
      pre.textContent = "";
      empty.hidden = false;
      after = "";
      follow();
    });
    window.addEventListener("pagehide", () => { if (controller) controller.abort(); });
    toBottom();
    // The latest lines came with the page; open the long-lived stream once the page has settled (so tools
    // that wait for an idle network, and the browser's own loading indicator, see the page as loaded).
    const start = () => setTimeout(follow, FOLLOW_DELAY_MS);
    if (document.readyState === "complete") start(); else window.addEventListener("load", start, { once: true });
  }

  function setupCharts(page) {
    const lossEl = document.getElementById("chart-loss");
    const speedEl = document.getElementById("chart-throughput");
    const note = page.querySelector("[data-metrics-note]");
    // worker -> Map(step -> value): a step redone after a restart replaces the earlier value.
    const loss = new Map();
    const speed = new Map();
    let after = "";
    let timer = null;

    const put = (series, worker, step, value) => {
      if (value === null || value === undefined) return;
      if (!series.has(worker)) series.set(worker, new Map());
      series.get(worker).set(step, value);
    };

    const option = (series, name, unit) => ({
      grid: { left: 56, right: 16, top: 28, bottom: 36 },
      tooltip: { trigger: "axis", valueFormatter: (v) => (typeof v === "number" ? `${v.toPrecision(4)}${unit}` : v) },
      legend: { top: 0, type: "scroll" },
      xAxis: { type: "value", name: "step", nameLocation: "middle", nameGap: 24, minInterval: 1 },
      yAxis: { type: "value", name, scale: true },
      series: Array.from(series.keys()).sort((a, b) => a - b).map((worker) => ({
        name: `worker ${worker}`, type: "line", showSymbol: false,
        data: Array.from(series.get(worker).entries()).sort((a, b) => a[0] - b[0]),
      })),
    });

    const draw = () => {
      if (loss.size) {
        Fleetyard.chart(lossEl, option(loss, "loss", ""));
        lossEl.closest("figure").classList.add("has-data");
      }
      if (speed.size) {
        Fleetyard.chart(speedEl, option(speed, "tokens/s", " tokens/s"));
        speedEl.closest("figure").classList.add("has-data");
      }
    };

    async function fetchNew() {
      let more = true;
      let changed = false;
      while (more) {
        const params = new URLSearchParams({ limit: "10000" });
        if (after !== "") params.set("after", after);
        const data = await Fleetyard.api(`${page.dataset.api}metrics/?${params}`);
        (data.results || []).forEach((m) => {
          put(loss, m.worker, m.step, m.loss);
          put(speed, m.worker, m.step, m.tokens_per_s);
        });
        changed = changed || (data.results || []).length > 0;
        more = (data.results || []).length >= 10000;
        if (data.next_after !== null && data.next_after !== undefined) after = data.next_after;
      }
      if (changed) draw();
    }

    async function tick() {
      const liveBefore = isLive();
      try {
        await fetchNew();
      } catch (error) {
        if (!(error instanceof Fleetyard.ApiError)) throw error;
        if (note) note.textContent = `metrics could not be read: ${error.message}; retrying`;
      }
      if (liveBefore) {
        timer = setTimeout(tick, METRICS_EVERY_MS);  // one more read after the job ends picks up its last steps
      } else if (note) {
        note.textContent = "as recorded";
      }
    }
    window.addEventListener("pagehide", () => { if (timer) clearTimeout(timer); });
    tick();
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (document.querySelector(".tabs")) setupTabs();
    const jobForm = document.getElementById("job-form");
    if (jobForm) setupJobForm(jobForm);
    const specForm = document.getElementById("spec-form");
    if (specForm) setupSpecForm(specForm);
    const page = document.getElementById("job-page");
    if (page) {
      setupLogs(page);
      setupCharts(page);
    }
  });
})();
