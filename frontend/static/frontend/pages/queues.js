/* Queues page: quota used against nominal and the borrowing cap, one bullet bar per cluster queue and
 * accelerator type (the cap behind, nominal in the middle, used in front); redrawn after each refresh. */
(function () {
  "use strict";

  const esc = window.Fleetyard.escapeHtml;
  const fmt = window.Fleetyard.formatNumber;

  function quotaOption(rows) {
    const names = rows.map((row) => `${row.queue} · ${row.type}`);
    return {
      legend: { top: 0, data: ["used", "nominal", "cap with borrowing"] },
      grid: { left: 24, right: 48, top: 32, bottom: 24, containLabel: true },
      tooltip: {
        trigger: "axis", axisPointer: { type: "shadow" },
        formatter: (params) => {
          const row = rows[params[0].dataIndex];
          const cap = row.limit === null ? "no cap (borrows any idle quota in its cohort)"
            : row.limit === row.nominal ? `${fmt(row.limit)} (cannot borrow)` : `${fmt(row.limit)} (nominal + ${fmt(row.borrowing_limit)} borrowing)`;
          return `<b>${esc(row.queue)}</b> · ${esc(row.type)}<br>used ${fmt(row.used)} ${esc(row.unit)}<br>nominal ${fmt(row.nominal)}<br>cap ${cap}`;
        },
      },
      xAxis: { type: "value", name: "devices (CPUs for cpu)", nameLocation: "middle", nameGap: 24 },
      // Two category axes over the same rows: the wide bars (cap, nominal) on one, the narrow `used`
      // bar on the other, so each is centred on its row whatever its width.
      yAxis: [
        { type: "category", data: names, inverse: true },
        { type: "category", data: names, inverse: true, show: false },
      ],
      series: [
        { name: "cap with borrowing", type: "bar", barGap: "-100%", barWidth: 20, itemStyle: { color: "#dfe3ea" },
          data: rows.map((row) => (row.limit === null ? null : row.limit)) },
        { name: "nominal", type: "bar", barGap: "-100%", barWidth: 20, itemStyle: { color: "#b9cbff" },
          data: rows.map((row) => row.nominal) },
        { name: "used", type: "bar", yAxisIndex: 1, barWidth: 8, z: 3,
          data: rows.map((row) => ({ value: row.used, itemStyle: { color: row.used > row.nominal ? "#d99000" : "#2f5bd3" } })),
          label: { show: true, position: "right", formatter: (p) => `${fmt(rows[p.dataIndex].used)} used`, fontSize: 11 } },
      ],
    };
  }

  function render() {
    document.querySelectorAll("[data-chart]:not([data-chart-ready])").forEach((el) => {
      const source = document.getElementById(el.dataset.source);
      if (!source) return;
      const rows = JSON.parse(source.textContent);
      el.style.height = `${Math.max(140, rows.length * 40 + 70)}px`;
      window.Fleetyard.chart(el, quotaOption(rows));
    });
  }

  document.addEventListener("DOMContentLoaded", render);
  document.addEventListener("htmx:afterSettle", render);
})();
