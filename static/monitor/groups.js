/* Runs drawn as groups with the vendored Plotly: on the compare page, each seed group as its mean curve with a
 * band (std or min-max) around it; on a sweep's page, its runs in parallel coordinates and each run's curve.
 * Both read JSON the server computed (webapp.monitor.groups); text from the server is set as text. */
(function () {
  "use strict";
  const PALETTE = ["#4f46e5", "#d93025", "#0f9d58", "#b7791f", "#2563eb", "#9333ea", "#0891b2", "#be185d"];
  const LAYOUT = { margin: { l: 48, r: 12, t: 8, b: 40 }, height: 320, showlegend: true,
                   legend: { orientation: "h", y: -0.2 }, xaxis: { title: { text: "step" } } };
  // No mode bar: these charts are read, not zoomed, and its 22 px buttons would be tap targets under 24 px.
  const OPTIONS = { responsive: true, displaylogo: false, displayModeBar: false };

  function fill(select, names, chosen) {
    select.replaceChildren(...names.map((n) => { const o = document.createElement("option"); o.value = n; o.textContent = n; o.selected = n === chosen; return o; }));
  }

  function rgba(hex, alpha) {
    const v = parseInt(hex.slice(1), 16);
    return `rgba(${(v >> 16) & 255},${(v >> 8) & 255},${v & 255},${alpha})`;
  }

  async function seedBands(card) {
    const metric = document.getElementById("band-metric");
    const kind = document.getElementById("band-kind");
    const chart = document.getElementById("band-chart");
    async function draw() {
      const url = `${card.dataset.url}&band=${encodeURIComponent(kind.value)}` + (metric.value ? `&metric=${encodeURIComponent(metric.value)}` : "");
      const answer = await (await fetch(url, { headers: { Accept: "application/json" } })).json();
      if (!metric.options.length) fill(metric, answer.metrics, answer.metric);
      const traces = [];
      answer.groups.forEach((g, i) => {
        const colour = PALETTE[i % PALETTE.length];
        traces.push({ x: g.x, y: g.upper, mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false });
        traces.push({ x: g.x, y: g.lower, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: rgba(colour, 0.2), hoverinfo: "skip", showlegend: false });
        traces.push({ x: g.x, y: g.mean, mode: "lines", name: g.label, line: { color: colour, width: 2 }, customdata: g.n,
                      hovertemplate: "step %{x}<br>mean %{y:.4g}<br>runs %{customdata}<extra></extra>" });
      });
      await Plotly.react(chart, traces, { ...LAYOUT, yaxis: { title: { text: answer.metric } } }, OPTIONS);
      card.dataset.drawn = String(answer.groups.length);
    }
    metric.addEventListener("change", draw);
    kind.addEventListener("change", draw);
    await draw();
  }

  // Parallel coordinates drawn as SVG lines: Plotly's own parcoords trace needs WebGL compiled by regl, which
  // builds code with Function() and so cannot run under the app's Content-Security-Policy (no unsafe-eval).
  // Each axis is one swept field (then the metric), scaled to its own range; each run is one line across them,
  // coloured from low (light) to high (dark) metric, the best run thickest; hovering a line shows its values.
  function axis(label, values) {
    if (values.every((v) => typeof v === "number" || v === null)) {
      const nums = values.filter((v) => v !== null);
      const lo = Math.min(...nums), hi = Math.max(...nums);
      const scale = (v) => (v === null ? null : hi === lo ? 0.5 : (v - lo) / (hi - lo));
      return { label, scaled: values.map(scale), low: nums.length ? String(+lo.toPrecision(4)) : "", high: nums.length ? String(+hi.toPrecision(4)) : "" };
    }
    const names = [...new Set(values.map(String))];
    const scale = (v) => (names.length === 1 ? 0.5 : names.indexOf(String(v)) / (names.length - 1));
    return { label, scaled: values.map(scale), low: names[0], high: names[names.length - 1] };
  }

  function shade(t) {  // light to dark along the accent colour
    const a = [199, 210, 254], b = [49, 46, 129];
    return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * t)).join(",")})`;
  }

  async function sweep(card) {
    const answer = await (await fetch(card.dataset.url, { headers: { Accept: "application/json" } })).json();
    const axes = answer.fields.map((f) => axis(f, answer.runs.map((r) => r.params[f])));
    axes.push(axis(answer.metric, answer.runs.map((r) => r.value)));
    const xs = axes.map((_, i) => i);
    const metricAxis = axes[axes.length - 1];
    const lines = answer.runs.map((r, i) => ({
      x: xs, y: axes.map((a) => a.scaled[i]), mode: "lines+markers", name: `#${r.job}`, showlegend: false,
      line: { color: shade(metricAxis.scaled[i] ?? 0), width: r.job === answer.best ? 4 : 2 }, marker: { size: 6 },
      text: axes.map((a, j) => `${a.label}: ${j < answer.fields.length ? r.params[a.label] : (r.value ?? "—")}`),
      hovertemplate: `#${r.job}<br>%{text}<extra></extra>`,
    }));
    const shapes = xs.map((x) => ({ type: "line", x0: x, x1: x, y0: 0, y1: 1, line: { color: "#9ca3af", width: 1 } }));
    const notes = axes.flatMap((a, x) => [
      { x, y: 1.12, text: a.label, showarrow: false, font: { size: 12 } },
      { x, y: 1.03, text: a.high, showarrow: false, font: { size: 10, color: "#6b7280" } },
      { x, y: -0.07, text: a.low, showarrow: false, font: { size: 10, color: "#6b7280" } },
    ]);
    await Plotly.react(document.getElementById("sweep-parcoords"), lines, {
      margin: { l: 40, r: 40, t: 48, b: 30 }, height: 320, shapes, annotations: notes, hovermode: "closest",
      xaxis: { visible: false, range: [-0.3, axes.length - 0.7] }, yaxis: { visible: false, range: [-0.12, 1.16] },
    }, OPTIONS);
    const traces = answer.runs.map((r, i) => ({ x: r.curve.x, y: r.curve.y, mode: "lines", name: `#${r.job} ${r.label}`,
      line: { color: PALETTE[i % PALETTE.length], width: r.job === answer.best ? 3 : 1.5 } }));
    await Plotly.react(document.getElementById("sweep-curves"), traces, { ...LAYOUT, yaxis: { title: { text: answer.metric } } }, OPTIONS);
    card.dataset.drawn = String(answer.runs.length);
  }

  function start() {
    const bands = document.getElementById("seed-bands");
    if (bands) seedBands(bands).catch((err) => { bands.append(document.createTextNode(`could not draw the groups: ${err.message}`)); });
    const group = document.getElementById("sweep-charts");
    if (group) sweep(group).catch((err) => { group.append(document.createTextNode(`could not draw the sweep: ${err.message}`)); });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
