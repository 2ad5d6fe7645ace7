/* Cluster page: the node utilization heatmap (pools x nodes), redrawn after every live refresh, and
 * a refresh of the live region right after a cordon / uncordon succeeds (no page reload). */
(function () {
  "use strict";

  const esc = window.Fleetyard.escapeHtml;
  const fmt = window.Fleetyard.formatNumber;

  function heatmapOption(data) {
    const columns = Array.from({ length: data.columns }, (_, i) => `node ${i + 1}`);
    const measured = [];
    const dark = [];
    data.cells.forEach((cell) => {
      const usable = cell.health === "healthy" && cell.percent !== null;
      const item = { value: [cell.x, cell.y, usable ? cell.percent : 0], cell };
      if (cell.cordoned) item.itemStyle = { borderColor: "#d99000", borderWidth: 4 };
      if (usable && cell.percent >= 60) item.label = { color: "#ffffff" };  // readable on the dark end
      (usable ? measured : dark).push(item);
    });
    const cellLabel = (p) => {
      const c = p.data.cell;
      const state = c.health !== "healthy" ? "UNREACHABLE" : c.percent === null ? "no capacity" : `${c.percent}%`;
      const tags = [c.cordoned ? "{c|CORDONED}" : "", c.simulated ? "{s|SIMULATED}" : ""].filter(Boolean).join(" ");
      return `{n|${c.name}}\n{p|${state}}${tags ? `\n${tags}` : ""}`;
    };
    const rich = {
      n: { fontSize: 12, fontWeight: "bold", lineHeight: 18 },
      p: { fontSize: 12, lineHeight: 18 },
      c: { fontSize: 10, fontWeight: "bold", color: "#8a5800", backgroundColor: "#fff1d6", padding: [2, 4], borderRadius: 3, lineHeight: 20 },
      s: { fontSize: 10, fontWeight: "bold", color: "#5b2fa8", backgroundColor: "#efe6ff", padding: [2, 4], borderRadius: 3, lineHeight: 20 },
    };
    return {
      grid: { left: 8, right: 16, top: 8, bottom: 56, containLabel: true },
      tooltip: {
        formatter: (p) => {
          const c = p.data.cell;
          const lines = [`<b>${esc(c.name)}</b>${c.simulated ? " (SIMULATED)" : ""}`,
            `${fmt(c.used)} of ${fmt(c.capacity)} ${esc(c.unit)} in use${c.percent !== null ? ` · ${c.percent}%` : ""}`,
            `health: ${esc(c.health)}${c.cordoned ? " · cordoned" : ""}`];
          return lines.join("<br>");
        },
      },
      xAxis: { type: "category", data: columns, splitArea: { show: true } },
      yAxis: { type: "category", data: data.pools, inverse: true, splitArea: { show: true } },
      visualMap: {
        seriesIndex: 0, min: 0, max: 100, calculable: false, orient: "horizontal", left: "center", bottom: 4,
        itemWidth: 12, itemHeight: 160, text: ["100% in use", "idle"],
        inRange: { color: ["#e3ecff", "#7fa2ff", "#2f5bd3", "#1c2f7a"] },
      },
      series: [
        { name: "utilization", type: "heatmap", data: measured, label: { show: true, formatter: cellLabel, rich, color: "#1f2430" },
          itemStyle: { borderColor: "#fff", borderWidth: 2 }, emphasis: { itemStyle: { shadowBlur: 6, shadowColor: "rgba(0,0,0,0.3)" } } },
        { name: "unavailable", type: "heatmap", data: dark, label: { show: true, formatter: cellLabel, rich, color: "#4b5263" },
          itemStyle: { color: "#d5d8de", borderColor: "#fff", borderWidth: 2 } },
      ],
    };
  }

  function render() {
    document.querySelectorAll("[data-chart]:not([data-chart-ready])").forEach((el) => {
      const source = document.getElementById(el.dataset.source);
      if (!source) return;
      const data = JSON.parse(source.textContent);
      el.style.height = `${Math.max(180, data.pools.length * 90 + 80)}px`;
      window.Fleetyard.chart(el, heatmapOption(data));
    });
  }

  document.addEventListener("DOMContentLoaded", render);
  document.addEventListener("htmx:afterSettle", render);
  // A cordon or uncordon went through: redraw the nodes now rather than at the next poll.
  document.addEventListener("fy:done", (event) => {
    const region = event.target.closest("#cluster-live");
    if (region && window.htmx) window.htmx.trigger(region, "refresh");
  });
})();
