/* Overview page: utilization bar charts (by node pool, by accelerator type), redrawn after every
 * live-region refresh. Data comes from the json_script block the server renders into the region. */
(function () {
  "use strict";

  const esc = window.Fleetyard.escapeHtml;
  const fmt = window.Fleetyard.formatNumber;

  const USED = "#2f5bd3";
  const FREE = "#e2e5ea";

  function label(row) {
    return row.simulated ? `{name|${row.name}} {sim|SIMULATED}` : `{name|${row.name}}`;
  }

  function utilizationOption(rows) {
    const names = rows.map((row) => row.name);
    // Room for the longest axis label (ECharts does not measure rich-text labels for containLabel).
    const left = 16 + Math.max(...rows.map((row) => row.name.length * 7.2 + (row.simulated ? 78 : 0)));
    const used = rows.map((row) => (row.percent === null ? 0 : row.percent));
    const free = rows.map((row) => (row.percent === null ? 0 : Math.max(0, 100 - row.percent)));
    return {
      grid: { left, right: 24, top: 8, bottom: 28 },
      tooltip: {
        trigger: "axis", axisPointer: { type: "shadow" },
        formatter: (params) => {
          const row = rows[params[0].dataIndex];
          const pct = row.percent === null ? "no capacity" : `${row.percent}%`;
          return `<b>${esc(row.name)}</b>${row.simulated ? " (SIMULATED)" : ""}<br>${fmt(row.used)} of ${fmt(row.capacity)} ${row.unit} in use · ${pct}`;
        },
      },
      xAxis: { type: "value", max: 100, axisLabel: { formatter: "{value}%" } },
      yAxis: {
        type: "category", data: names, inverse: true,
        axisLabel: {
          formatter: (value, index) => label(rows[index]),
          rich: {
            name: { fontSize: 12, color: "#1f2430" },
            sim: { fontSize: 10, color: "#5b2fa8", fontWeight: "bold", backgroundColor: "#efe6ff", padding: [1, 4], borderRadius: 3 },
          },
        },
      },
      series: [
        {
          name: "in use", type: "bar", stack: "capacity", data: used, barMaxWidth: 22,
          itemStyle: { color: USED },
          label: {
            show: true, position: "insideLeft", color: "#fff", fontSize: 11,
            formatter: (p) => { const row = rows[p.dataIndex]; return row.percent >= 18 ? `${fmt(row.used)}/${fmt(row.capacity)}` : ""; },
          },
        },
        {
          name: "free", type: "bar", stack: "capacity", data: free, barMaxWidth: 22,
          itemStyle: { color: FREE },
          label: {
            show: true, position: "insideRight", color: "#4b5263", fontSize: 11,
            formatter: (p) => { const row = rows[p.dataIndex]; return row.percent === null ? "no capacity" : `${row.percent}%`; },
          },
        },
      ],
    };
  }

  function render() {
    document.querySelectorAll("[data-chart]:not([data-chart-ready])").forEach((el) => {
      const source = document.getElementById(el.dataset.source);
      if (!source) return;
      const data = JSON.parse(source.textContent);
      const rows = el.dataset.chart === "util-pools" ? data.pools : data.types;
      el.style.height = `${Math.max(120, rows.length * 44 + 40)}px`;
      window.Fleetyard.chart(el, utilizationOption(rows));
    });
  }

  document.addEventListener("DOMContentLoaded", render);
  document.addEventListener("htmx:afterSettle", render);
})();
