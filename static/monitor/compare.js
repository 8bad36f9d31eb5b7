/* The compare page: the metrics of several jobs overlaid, one colour per job. Each job's history comes
 * downsampled from its series.json, then its own socket (from the answer's last_seq) keeps it growing, so a
 * running job grows next to finished ones; zooming a chart reloads every job's lines in that range. */
(function () {
  "use strict";
  const M = window.AgentFlyMonitor;
  const config = JSON.parse(document.getElementById("monitor-config").textContent);
  const container = document.getElementById("charts");
  if (!container || !config.jobs.length) return;
  const fetchers = new Map(config.jobs.map((job) => [String(job.id), M.rangeFetcher(job.series_url)]));
  const charts = new M.MetricCharts(container, {
    band: false, extras: M.moreMetrics(), user: config.user, fetchRange: (series, keys, range) => fetchers.get(String(series))(keys, range) });
  M.bindChartControls(charts);
  const legend = document.getElementById("compare-legend");
  const page = { charts, drawnAt: null, sockets: [] };
  window.agentflyCompare = page;
  config.jobs.forEach((job, i) => charts.setSeriesName(job.id, `#${job.id} ${job.name}`));

  async function open(job, i) {
    const state = M.el("span", { class: "muted small", text: " loading history" });
    legend.append(M.el("span", { class: "legend-item" },
      M.el("span", { class: "swatch", style: `background:${M.PALETTE[i % M.PALETTE.length]}` }),
      M.el("a", { href: job.dashboard_url, text: `#${job.id} ${job.name}` }), state));
    const history = await M.getJSON(`${job.series_url}?only=metrics`);
    charts.setStartSteps(job.id, history.starts || []);
    charts.load(job.id, history.metrics, history.times);
    const socket = new M.EventSocket(job.ws_path, {
      onEvents: (events) => {
        for (const event of events) {
          if (event.type === "metrics") charts.addLive(job.id, event.seq, event.step ?? event.seq, M.numericMetrics(M.payload(event)), event.time);
        }
      },
      onState: (s, detail) => { state.textContent = ` ${detail || s}`; },
    }, history.last_seq);
    page.sockets.push(socket);
    socket.start();
  }

  Promise.all(config.jobs.map(open)).then(() => {
    charts.flush();
    page.drawnAt = performance.now();
    document.body.dataset.history = "drawn";
  }).catch((err) => { legend.append(M.el("span", { class: "bad", text: ` could not load a history: ${err.message}` })); });
})();
