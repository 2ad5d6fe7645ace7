/* Planner page: builds POST /api/v1/plans/'s body from the form (a preset or custom model fields, the checked
 * pools with an optional device count each, rows of hypothetical devices, the search options), shows the API's
 * field errors under their fields, and renders the answer: the best layout and its alternatives, why it wins,
 * each accelerator type alone beside the mix, the pools (SIMULATED ones labelled) and the assumptions. */
(function () {
  "use strict";

  const { api, ApiError, escapeHtml: esc, formBody, showErrors, clearErrors } = window.Fleetyard;
  const form = document.getElementById("plan-form");
  const out = document.getElementById("plan-result");
  if (!form || !out) return;
  const preset = form.querySelector("[data-plan-preset]");
  const custom = form.querySelector("[data-plan-custom]");

  preset.addEventListener("change", () => { custom.hidden = preset.value !== "custom"; });

  function money(value) {
    if (value === null || value === undefined) return "unknown";
    const n = Number(value);
    if (n > 0 && n < 0.01) return `$${n.toPrecision(2)}`;  // "$0.00" read as free
    return `$${n.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
  }
  /* A number with exactly `digits` decimals (0 by default), grouped: columns read alike ("1.00x", "3.00x"). */
  function num(value, digits) {
    const d = digits === undefined ? 0 : digits;
    return Number(value).toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  }
  /* A whole number as typed, or the text itself so that the API refuses it under its field (parseInt read "1e2"
   * as 1 and "8.9" as 8). */
  function whole(text) {
    const n = Number(text);
    return text.trim() !== "" && Number.isInteger(n) ? n : text;
  }

  let deviceRows = [];
  let poolRows = [];

  /* The API's errors about one device or pool entry keyed by the form row the entry came from, so they show under
     that row: serializer errors ({"devices": {"0": {"count": [...]}}}) and the service's ("devices[0]: 12 devices
     is neither whole nodes ...", "pools[1]: ..."), whose index counts the entries sent, not the form's rows (they
     showed in the form's top box or beside the fieldset, with the API's index; found by QA). */
  function rowsUnderErrors(body) {
    if (!body || typeof body !== "object") return body;
    const rows = { devices: deviceRows, pools: poolRows };
    const rest = { ...body };
    for (const key of Object.keys(rows)) {
      const errors = body[key];
      if (!errors || typeof errors !== "object") continue;
      delete rest[key];
      const left = [];
      const place = (i, text) => {
        const name = rows[key][i];
        if (name) rest[name] = [...(rest[name] || []), text]; else left.push(`${key}[${i}]: ${text}`);
      };
      const pattern = new RegExp(`^${key}\\[(\\d+)\\]: ([\\s\\S]*)$`);
      Object.entries(errors).forEach(([index, entry]) => {
        if (/^\d+$/.test(index) && entry && typeof entry === "object" && !Array.isArray(entry)) {
          const text = Object.entries(entry).map(([field, reasons]) => `${field.replace(/_/g, " ")}: ${[].concat(reasons).join(" ")}`).join("; ");
          if (text) place(Number(index), text);
          return;
        }
        [].concat(entry).forEach((line) => {
          const match = typeof line === "string" ? line.match(pattern) : null;
          if (match) place(Number(match[1]), match[2]); else left.push(line);
        });
      });
      if (left.length) rest[key] = left;
    }
    return rest;
  }

  /* The request body, or null after showing why the form cannot be sent. */
  function body() {
    const data = formBody(form);  // compare, options.*
    data.global_batch_size = whole(form.querySelector("[name=global_batch_size]").value);
    if (preset.value === "custom") {
      const text = form.querySelector("#p-custom").value;
      try {
        data.model = JSON.parse(text);
      } catch (err) {
        showErrors(form, { body: { model_fields: [`the model fields are not valid JSON: ${err.message}`] } });
        return null;
      }
    }
    data.pools = [];
    poolRows = [];  // the checkbox (its name) of each pool entry sent
    form.querySelectorAll("[data-plan-pool]").forEach((box) => {
      if (!box.checked) return;
      poolRows.push(box.name);
      const entry = { pool: box.dataset.planPool };
      const input = form.querySelector(`[data-plan-pool-devices="${CSS.escape(box.dataset.planPool)}"]`);
      const count = input ? input.value.trim() : "";
      if (count) entry.devices = whole(count);
      data.pools.push(entry);
    });
    data.devices = [];
    deviceRows = [];  // the form row (its select's name) of each entry sent, for the API's per-entry errors
    const rowErrors = {};
    form.querySelectorAll(".plan-devices").forEach((row) => {
      const select = row.querySelector("[data-plan-device-type]");
      const type = select.value;
      const count = row.querySelector("[data-plan-device-count]").value.trim();
      const perNode = row.querySelector("[data-plan-device-per-node]").value.trim();
      if (!type && !count && !perNode) return;
      if (!type) { rowErrors[select.name] = ["choose an accelerator type for these devices"]; return; }
      if (!count) { rowErrors[select.name] = [`how many ${type} devices?`]; return; }
      const entry = { accelerator_type: type, count: whole(count) };
      if (perNode) entry.devices_per_node = whole(perNode);
      data.devices.push(entry);
      deviceRows.push(select.name);
    });
    if (Object.keys(rowErrors).length) { showErrors(form, { body: rowErrors }); return null; }
    return data;
  }

  function layoutRows(result) {
    const options = [result.best, ...result.alternatives];
    return options.map((o, i) => `<tr${i === 0 ? ' class="plan-best"' : ""}>
      <td>${i === 0 ? "<strong>best</strong>" : i}</td><td>${esc(o.description)}</td><td class="num">${o.layout.devices}</td>
      <td class="num">${Number(o.step_time_s).toPrecision(3)}</td><td class="num">${num(o.tokens_per_s)}</td>
      <td class="num">${num(100 * o.mfu, 1)}%</td><td class="num">${num(o.memory_gb, 1)} / ${num(o.memory_limit_gb, 1)}</td>
      <td class="num">${money(o.cost_per_hour_usd)}</td><td class="num">${money(o.cost_per_million_tokens_usd)}</td></tr>`).join("");
  }

  function render(result) {
    const sim = '<span class="badge badge-sim" title="logical chips on a CPU host: figures are the real chip\'s, nothing ran on it">SIMULATED</span>';
    const pools = result.pools.map((p) => `<li><strong>${esc(p.name)}</strong> · ${p.devices} ${esc(p.accelerator_type)}
      (${p.nodes} ${p.nodes === 1 ? "node" : "nodes"} x ${p.devices_per_node})${p.source === "hypothetical" ? ' <span class="badge tone-muted">hypothetical</span>' : ""}${p.simulated ? ` ${sim}` : ""}
      <span class="muted small">· ${money(p.price_per_hour_usd)} per device-hour · ${num(p.achievable_fraction, 3)} of peak (${esc(p.achievable_fraction_source)})</span></li>`).join("");
    const model = result.model;
    let html = `<div class="card"><h2>${esc(model.name || model.preset || "model")} <span class="muted small">${num(model.parameters / 1e9, 2)}B parameters ·
      ${model.layers} layers · global batch ${result.global_batch_size} · sequence ${model.seq_len}</span></h2><ul class="plan-pools">${pools}</ul>`;
    const simulated = new Set(result.pools.filter((p) => p.simulated).map((p) => p.name));
    if (simulated.size) {
      html += `<p class="note" data-plan-simulated>${sim} ${esc([...simulated].join(", "))}: the predictions use the real chips' published figures; no such chip ran anything here.</p>`;
    }
    if (!result.feasible) {
      html += `<div class="alert alert-error" role="alert" data-plan-infeasible><p><strong>No plan:</strong> ${esc(result.reason)}</p></div>`;
    } else {
      html += `<p class="note">Predicted by the planner's cost model, not measured.</p>
      <div class="table-scroll"><table class="table" data-plan-layouts><thead><tr><th></th><th>Layout</th><th class="num">Devices</th><th class="num">Step s</th>
      <th class="num">Tokens/s</th><th class="num">MFU</th><th class="num">Memory GB</th><th class="num plan-money">$ / hour</th><th class="num plan-money">$ / M tokens</th></tr></thead>
      <tbody>${layoutRows(result)}</tbody></table></div><p data-plan-why><strong>Why:</strong> ${esc(result.best.reason || result.reason)}</p>`;
    }
    html += "</div>";
    const comparison = result.compare;
    if (comparison) {
      const rows = comparison.by_type.map((row) => `<tr><td>${esc(row.accelerator_type)}${row.pools.length && row.pools.every((name) => simulated.has(name)) ? ` ${sim}` : ""}</td><td class="num">${row.devices}</td>
        <td>${row.best ? esc(row.best.description) : `<span class="warn-text">${esc(row.reason)}</span>`}</td>
        <td class="num">${row.best ? num(row.best.tokens_per_s) : "—"}</td><td class="num">${row.best ? money(row.best.cost_per_million_tokens_usd) : "—"}</td>
        <td class="num">${row.step_time_ratio_to_mix === null ? "—" : `${num(row.step_time_ratio_to_mix, 2)}x`}</td></tr>`).join("");
      const speedup = comparison.mix_speedup_over_fastest_single_type;
      html += `<div class="card" data-plan-compare><h2>Each accelerator type alone</h2><div class="table-scroll"><table class="table"><thead><tr><th>Type</th><th class="num">Devices</th>
        <th>Best layout</th><th class="num">Tokens/s</th><th class="num plan-money">$ / M tokens</th><th class="num">Step time vs all together</th></tr></thead><tbody>${rows}</tbody></table></div>
        ${speedup === null || comparison.by_type.length < 2 ? "" : `<p class="note">All together is ${num(speedup, 2)}x as fast as the fastest type alone (${esc(comparison.fastest_single_type)}); the cheapest per token alone: ${esc(comparison.cheapest_single_type || "unknown")}.</p>`}</div>`;
    }
    html += `<div class="card"><h2>Assumptions</h2><ul class="small">${result.assumptions.map((a) => `<li>${esc(a)}</li>`).join("")}</ul>
      <p class="note">${num(result.candidates_evaluated)} layouts evaluated in ${num(result.search_time_s, 2)} s.</p></div>`;
    out.innerHTML = html;
    out.hidden = false;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    out.hidden = true;  // an old answer must not stand next to a new request's errors
    const data = body();
    if (!data) return;
    const button = form.querySelector('[type="submit"]');
    const label = button.textContent;
    button.textContent = button.dataset.busy;
    button.disabled = true;
    try {
      render(await api("/api/v1/plans/", { method: "POST", body: data }));
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      if (preset.value === "custom" && error.body && error.body.model) {  // about the fields typed in the textarea
        const { model, ...rest } = error.body;
        error.body = { ...rest, model_fields: model };
      }
      error.body = rowsUnderErrors(error.body);
      showErrors(form, error);
    } finally {
      button.textContent = label;
      button.disabled = false;
    }
  });
})();
