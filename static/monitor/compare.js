/* The compare page: the metrics of several jobs overlaid, one colour per job, each job on its own socket
 * (history, then live), so a running job keeps growing next to finished ones. */
(function () {
  "use strict";
  const M = window.AgentFlyMonitor;
  const config = JSON.parse(document.getElementById("monitor-config").textContent);
  const container = document.getElementById("charts");
  if (!container || !config.jobs.length) return;
  const charts = new M.MetricCharts(container, { band: false, extras: M.moreMetrics() });
  M.bindChartControls(charts);
  const legend = document.getElementById("compare-legend");
  config.jobs.forEach((job, i) => {
    charts.setSeriesName(job.id, `#${job.id} ${job.name}`);
    const state = M.el("span", { class: "muted small", text: " connecting" });
    legend.append(M.el("span", { class: "legend-item" },
      M.el("span", { class: "swatch", style: `background:${M.PALETTE[i % M.PALETTE.length]}` }),
      M.el("a", { href: job.dashboard_url, text: `#${job.id} ${job.name}` }), state));
    let count = 0;
    new M.EventSocket(job.ws_path, {
      onEvents: (events) => {
        for (const event of events) {
          count += 1;
          if (event.type === "metrics") charts.add(job.id, event.step ?? count, M.numericMetrics(M.payload(event)));
        }
      },
      onState: (s, detail) => { state.textContent = ` ${detail || s}`; },
    }).start();
  });
})();
