/* Deployments pages: the create form's choices, the SLA charts, action feedback and the playground.
 *
 * Forms and buttons that act (create, scale, update, delete) are console.js's generic data-api ones; this
 * file only adds what is particular to deployments.
 */
(function () {
  "use strict";

  const METRICS_POLL_MS = 5000;

  /* ------------------------------------------------------------------ create form */

  function setupCreateForm(form) {
    const radios = form.querySelectorAll('input[name="source"]');
    const syncSource = () => {
      const chosen = form.querySelector('input[name="source"]:checked');
      const source = chosen ? chosen.value : "uri";
      form.querySelectorAll("[data-source]").forEach((block) => {
        const on = block.dataset.source === source;
        block.hidden = !on;
        block.querySelectorAll("input, select").forEach((input) => { input.disabled = !on; });
      });
    };
    radios.forEach((radio) => radio.addEventListener("change", syncSource));
    syncSource();

    // Several teams: only the chosen team's queues and jobs are offered.
    const team = form.querySelector("[data-team-select]");
    const filterByTeam = () => {
      if (!team) return;
      form.querySelectorAll("select option[data-team]").forEach((option) => {
        option.hidden = option.dataset.team !== team.value;
        option.disabled = option.hidden;
      });
      form.querySelectorAll("select").forEach((select) => {
        const current = select.selectedOptions[0];
        if (current && current.disabled) {
          const first = Array.from(select.options).find((o) => !o.disabled);
          if (first) select.value = first.value;
        }
      });
    };
    if (team) { team.addEventListener("change", filterByTeam); filterByTeam(); }

    // A job brings the accelerator types it trained on (when they have pools here).
    const job = form.querySelector('select[name="source_job"]');
    if (job) {
      job.addEventListener("change", () => {
        const option = job.selectedOptions[0];
        const wanted = option && option.dataset.accelerators ? option.dataset.accelerators.split(",") : [];
        const boxes = Array.from(form.querySelectorAll('input[name="accelerator_types"]'));
        if (!boxes.some((box) => wanted.includes(box.value))) return;
        boxes.forEach((box) => { box.checked = wanted.includes(box.value); });
      });
    }
  }

  /* ------------------------------------------------------------------ charts */

  const MUTED = "#6b7280";
  const SLA_COLOR = "#a42620";

  function minuteLabel(iso) {
    const d = new Date(iso);
    return `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
  }

  function emptyTitle(points, key) {
    const any = points.some((p) => p[key] !== null && p[key] !== undefined && (key !== "requests" || p[key] > 0));
    return any ? { show: false } : {
      show: true, text: "no requests in this window", left: "center", top: "middle",
      textStyle: { color: MUTED, fontSize: 12, fontWeight: "normal" },
    };
  }

  function latencyOption(points, key, sla, unit) {
    return {
      title: emptyTitle(points, key),
      grid: { left: 48, right: 16, top: 24, bottom: 28 },
      tooltip: { trigger: "axis", valueFormatter: (v) => (v === null || v === undefined ? "—" : `${Number(v).toFixed(1)} ${unit}`) },
      xAxis: { type: "category", data: points.map((p) => minuteLabel(p.minute)), axisLabel: { color: MUTED } },
      yAxis: {
        type: "value", name: unit, nameTextStyle: { color: MUTED }, axisLabel: { color: MUTED },
        min: 0, max: (extent) => Math.ceil(Math.max(extent.max || 0, sla) * 1.2),
      },
      series: [{
        name: "p95", type: "line", data: points.map((p) => p[key]), connectNulls: false, symbolSize: 6,
        lineStyle: { width: 2 }, itemStyle: { color: "#2f5bd3" },
        markLine: {
          symbol: "none", silent: true, lineStyle: { color: SLA_COLOR, type: "dashed", width: 1.5 },
          label: { formatter: `SLA ${sla} ${unit}`, color: SLA_COLOR, position: "insideEndTop" },
          data: [{ yAxis: sla }],
        },
      }],
    };
  }

  function loadOption(points) {
    return {
      title: emptyTitle(points, "requests"),
      grid: { left: 40, right: 48, top: 24, bottom: 48 },
      legend: { bottom: 0, left: "center", textStyle: { color: MUTED, fontSize: 11 }, itemWidth: 12, itemHeight: 8 },
      tooltip: { trigger: "axis" },
      xAxis: { type: "category", data: points.map((p) => minuteLabel(p.minute)), axisLabel: { color: MUTED } },
      yAxis: [
        { type: "value", name: "req", minInterval: 1, nameTextStyle: { color: MUTED }, axisLabel: { color: MUTED } },
        { type: "value", name: "tok/s", nameTextStyle: { color: MUTED }, axisLabel: { color: MUTED }, splitLine: { show: false } },
      ],
      series: [
        { name: "served", type: "bar", stack: "req", data: points.map((p) => p.requests - p.errors), itemStyle: { color: "#8fb0f5" } },
        { name: "errors", type: "bar", stack: "req", data: points.map((p) => p.errors), itemStyle: { color: "#e07b75" } },
        { name: "output tok/s", type: "line", yAxisIndex: 1, symbolSize: 5, itemStyle: { color: "#17693a" },
          data: points.map((p) => Math.round((p.output_tokens / 60) * 100) / 100) },
      ],
    };
  }

  function drawCharts(data) {
    const ttft = document.getElementById("chart-ttft");
    const tpot = document.getElementById("chart-tpot");
    const load = document.getElementById("chart-load");
    if (ttft) Fleetyard.chart(ttft, latencyOption(data.series, "ttft_p95_ms", data.sla.ttft_p95_ms, "ms"));
    if (tpot) Fleetyard.chart(tpot, latencyOption(data.series, "tpot_p95_ms", data.sla.tpot_p95_ms, "ms"));
    if (load) Fleetyard.chart(load, loadOption(data.series));
  }

  function setupCharts(script) {
    const data = JSON.parse(script.textContent);
    drawCharts(data);
    let inFlight = false;
    const poll = async () => {
      if (inFlight || document.hidden) return;
      inFlight = true;
      try {
        const fresh = await Fleetyard.api(`${data.metrics_url}?window=${data.window_s}`);
        drawCharts({ series: fresh.series, sla: fresh.sla });
      } catch (error) {
        if (!(error instanceof Fleetyard.ApiError)) throw error;
        // A deleted deployment (or a lost connection): keep the last charts; the page says what happened.
      } finally {
        inFlight = false;
      }
    };
    window.setInterval(poll, METRICS_POLL_MS);
    document.body.addEventListener("fy-refresh", poll);
  }

  /* ------------------------------------------------------------------ scale / update feedback */

  function setupActionFeedback() {
    document.addEventListener("fy:done", (event) => {
      const form = event.target.closest && event.target.closest("form[data-refresh]");
      if (!form) return;
      const data = event.detail || {};
      if (data.spec) {
        Fleetyard.flash(`Revision r${data.spec.revision} submitted: it rolls out while the deployment keeps ` +
          "serving, and the state above follows it back to SERVING.", "success");
        document.querySelectorAll("form[data-refresh]").forEach((f) => fillFromSpec(f, data.spec));
      }
      const panel = form.closest("details");
      if (panel) panel.open = false;
      document.body.dispatchEvent(new Event("fy-refresh"));
    });
  }

  /* The action forms start from the spec in force: after a change, from the new one. */
  function fillFromSpec(form, spec) {
    const values = {
      replicas_min: spec.replicas_min, replicas_max: spec.replicas_max, router: spec.router,
      model_uri: spec.model_uri, engine: JSON.stringify(spec.engine || {}, null, 2),
      "sla.ttft_p95_ms": spec.sla.ttft_p95_ms, "sla.tpot_p95_ms": spec.sla.tpot_p95_ms,
      "sla.min_throughput_tps": spec.sla.min_throughput_tps,
    };
    for (const [name, value] of Object.entries(values)) {
      const input = form.querySelector(`[name="${name}"]`);
      if (input) input.value = value === null || value === undefined ? "" : String(value);
    }
  }

  /* ------------------------------------------------------------------ playground */

  const STATUS_TITLES = {
    400: "The request was refused",
    403: "Not allowed",
    404: "Not found",
    409: "The deployment takes no requests",
    413: "The prompt is too large",
    429: "Overloaded: every replica's queue is full, try again in a moment",
    499: "Stopped",
    502: "The model failed",
    503: "Not serving",
    504: "The model did not answer in time",
  };

  function setupPlayground(form) {
    const url = form.dataset.url;
    const prompt = form.querySelector('textarea[name="prompt"]');
    const maxTokens = form.querySelector('input[name="max_tokens"]');
    const temperature = form.querySelector('input[name="temperature"]');
    const send = document.getElementById("pg-send");
    const stop = document.getElementById("pg-stop");
    const answer = document.getElementById("playground-answer");
    const text = document.getElementById("pg-text");
    const status = document.getElementById("pg-status");
    const errorBox = document.getElementById("pg-error");
    const stats = document.getElementById("pg-stats");
    let controller = null;

    const showError = (title, message) => {
      errorBox.hidden = false;
      errorBox.textContent = "";
      const strong = document.createElement("strong");
      strong.textContent = title;
      errorBox.appendChild(strong);
      if (message) errorBox.appendChild(document.createTextNode(` — ${message}`));
    };

    const showStats = (rows) => {
      stats.textContent = "";
      rows.forEach(([label, value]) => {
        const dt = document.createElement("dt");
        dt.textContent = label;
        const dd = document.createElement("dd");
        dd.textContent = value;
        stats.append(dt, dd);
      });
      stats.hidden = false;
    };

    const ms = (value) => {
      if (value === null || value === undefined) return "—";
      const n = Number(value);
      return `${n < 10 ? n.toFixed(2) : n.toFixed(1)} ms`;
    };

    stop.addEventListener("click", () => { if (controller) controller.abort(); });

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (controller) return;
      answer.hidden = false;
      errorBox.hidden = true;
      stats.hidden = true;
      text.textContent = "";
      if (!prompt.value.trim()) {
        status.textContent = "";
        showError("Write a prompt first", "the model answers the text in the box above.");
        prompt.focus();
        return;
      }
      const body = { messages: [{ role: "user", content: prompt.value }], stream_options: { include_usage: true } };
      const max = Number.parseInt(maxTokens.value, 10);
      if (!Number.isNaN(max)) body.max_tokens = max;
      const temp = Number.parseFloat(temperature.value);
      if (!Number.isNaN(temp)) body.temperature = temp;

      controller = new AbortController();
      send.disabled = true;
      send.textContent = "Streaming…";
      stop.hidden = false;
      text.classList.add("streaming");
      status.textContent = "· waiting for the first token…";
      const started = performance.now();
      let firstAt = null;
      let chunks = 0;
      let finish = null;
      let extra = null;
      let usage = null;
      let failed = false;
      try {
        await Fleetyard.streamEvents(url, body, (chunk) => {
          if (chunk.error) {
            failed = true;
            showError(STATUS_TITLES[502], chunk.error.message);
            return;
          }
          if (chunk.usage) usage = chunk.usage;
          if (chunk.fleetyard) extra = chunk.fleetyard;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) return;
          const delta = choice.delta && choice.delta.content;
          if (delta) {
            if (firstAt === null) firstAt = performance.now() - started;
            chunks += 1;
            text.textContent += delta;
            text.scrollTop = text.scrollHeight;
            status.textContent = `· streaming, ${chunks} piece${chunks === 1 ? "" : "s"} so far`;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }, { signal: controller.signal });
        if (!failed) status.textContent = `· done (${finish || "stop"})`;
      } catch (error) {
        if (error && error.name === "AbortError") {
          status.textContent = "· stopped";
        } else if (error instanceof Fleetyard.ApiError) {
          failed = true;
          status.textContent = "";
          const title = STATUS_TITLES[error.status] || "The request failed";
          showError(error.status ? `${error.status} · ${title}` : title, error.message);
        } else {
          failed = true;
          status.textContent = "";
          showError("The stream broke", String(error && error.message ? error.message : error));
        }
      } finally {
        controller = null;
        send.disabled = false;
        send.textContent = "Send";
        stop.hidden = true;
        text.classList.remove("streaming");
      }
      if (!text.textContent && failed) return;
      const total = performance.now() - started;
      showStats([
        ["TTFT (replica)", ms(extra && extra.ttft_ms)],
        ["TPOT (replica)", ms(extra && extra.tpot_ms)],
        ["First text in browser", ms(firstAt)],
        ["Prompt tokens", usage ? String(usage.prompt_tokens) : "—"],
        ["Output tokens", usage ? String(usage.completion_tokens) : String(chunks)],
        ["Total", ms(total)],
        ["Cached prompt tokens", extra ? String(extra.cached_tokens) : "—"],
        ["Replica", extra && extra.replica ? extra.replica : "—"],
        ["Finish", finish || "—"],
      ]);
      document.body.dispatchEvent(new Event("fy-refresh"));  // the request is in the metrics now
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const create = document.getElementById("deployment-form");
    if (create) setupCreateForm(create);
    const metrics = document.getElementById("deployment-metrics");
    if (metrics) setupCharts(metrics);
    setupActionFeedback();
    const playground = document.getElementById("playground-form");
    if (playground) setupPlayground(playground);
  });
})();
