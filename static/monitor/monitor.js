/* AgentFly live monitoring, shared by the dashboard and the compare page.
 *
 * EventSocket: one websocket per job. The page first loads the job's history from `series.json`
 * (downsampled, as of seq N), then opens the socket with `?after=N`: the server sends what was stored after
 * N, then live events, each with the job's sequence number; the socket drops what it already has, and on a
 * gap or a lost connection it reconnects with back-off asking for `?after=<last seq>`, so the page never
 * shows a hole or a duplicate. Sample events (and any event too big to inline) arrive as stubs
 * (`stub: true`, no data) and are fetched by seq when shown (`fetchEvent`).
 *
 * MetricCharts: Plotly charts that grow with `Plotly.extendTraces`, batched: points are queued as events
 * arrive and drawn at most every FLUSH_MS, one call per chart. Smoothing (debiased EMA, as TensorBoard
 * draws it) and the log scale are display-only: the raw stored values are always kept and drawn.
 * `load` draws a downsampled history (min/max per bucket, so extremes survive); zooming a chart (Plotly's
 * `plotly_relayout`) asks the server for the visible step range at full resolution and redraws that chart
 * from it, plus the live points heard since the answer's `last_seq`.
 */
(function () {
  "use strict";

  const FLUSH_MS = 250;
  const LIVE_KEPT = 5000; // live metrics events kept for replay after a zoom
  const MAX_MARKERS = 200;
  const FATAL_CLOSE = {
    4400: "The page asked for a bad sequence number; reload it.",
    4401: "You are signed out; sign in again to keep watching.",
    4403: "This job is not one of your teams' jobs.",
  };

  /* ------------------------------------------------------------------------------------ the socket */
  class EventSocket {
    constructor(path, handlers, after) {
      this.path = path;
      this.handlers = handlers;
      this.lastSeq = after || 0;
      this.attempt = 0;
      this.ws = null;
      this.stopped = false;
      this.timer = null;
      // The system switched light/dark: redraw in the page's new colours.
      window.matchMedia?.("(prefers-color-scheme: dark)")?.addEventListener?.("change", () => this._redrawAll());
    }

    start() { this._connect(); return this; }

    stop() { this.stopped = true; clearTimeout(this.timer); if (this.ws) this.ws.close(1000); }

    _state(state, detail) { if (this.handlers.onState) this.handlers.onState(state, detail || ""); }

    _connect() {
      const proto = location.protocol === "https:" ? "wss:" : "ws:";
      const ws = new WebSocket(`${proto}//${location.host}${this.path}?after=${this.lastSeq}`);
      this.ws = ws;
      this._state("connecting");
      let refusal = "";
      ws.onmessage = (e) => {
        const message = JSON.parse(e.data);
        if (message.type === "error") { refusal = message.message; return; }
        this._message(message, ws);
      };
      ws.onclose = (e) => {
        if (ws !== this.ws || this.stopped) return;
        if (FATAL_CLOSE[e.code]) { this.stopped = true; this._state("refused", refusal || FATAL_CLOSE[e.code]); return; }
        // Back-off with jitter: 0.5 s, 1 s, 2 s ... up to 15 s, so a restarting server is not stampeded.
        const delay = Math.min(15000, 500 * 2 ** this.attempt) * (0.5 + Math.random() / 2);
        this.attempt += 1;
        this._state("reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)} s`);
        this.timer = setTimeout(() => this._connect(), delay);
      };
    }

    _message(message, ws) {
      if (message.type === "hello") {
        this.attempt = 0;
        if (this.handlers.onHello) this.handlers.onHello(message.job);
        this._state("loading", "loading history");
      } else if (message.type === "live") {
        this._state("live");
      } else if (message.type === "events") {
        const fresh = message.events.filter((e) => e.seq > this.lastSeq);
        if (!fresh.length) return;
        if (fresh[0].seq !== this.lastSeq + 1) {
          // The server never sends a gap; if one shows up anyway, ask again from what we have.
          ws.close(4000);
          return;
        }
        for (let i = 1; i < fresh.length; i++) {
          if (fresh[i].seq !== fresh[i - 1].seq + 1) { fresh.length = i; break; }
        }
        this.lastSeq = fresh[fresh.length - 1].seq;
        this.handlers.onEvents(fresh);
      }
    }
  }

  /* ------------------------------------------------------------------------------ event payloads */
  // Every stored event's `data` is its typed payload as the trainer wrote it (trainer/events.py).
  function payload(event) { return event.data || {}; }

  function normKey(key) { return String(key).toLowerCase().replace(/[^a-z0-9]+/g, "_").replace(/^_|_$/g, ""); }

  function numericMetrics(values, prefix, out) {
    out = out || {};
    for (const [k, v] of Object.entries(values)) {
      if (k === "step") continue;
      const key = prefix ? `${prefix}_${normKey(k)}` : normKey(k);
      if (typeof v === "number" && Number.isFinite(v)) out[key] = v;
      else if (v && typeof v === "object" && !Array.isArray(v)) numericMetrics(v, key, out);
    }
    return out;
  }

  /* ---------------------------------------------------------------------------------- the charts */
  // The one list of charts: each claims metrics by the trainer's names (trainer/loop.py) as normKey writes
  // them. keys: the main line (the first present); lines: more keys drawn as lines; prefix: every key that
  // starts with it is a line too, except `exclude` (left to other charts) and `drop` (claimed, not drawn);
  // y: the y axis (title with its unit; rangemode "tozero" for counts and times; tickformat); y2: lines on a
  // right-hand axis (`match` tests the key); skipStart: the first step of each run (start-up: compiling,
  // warming caches) is not drawn, so it does not squash the steady state.
  const TIME_ONE_OFF = ["time_step", "time_step_cpu", "time_train", "time_eval", "time_checkpoint"];
  const CHARTS = [
    { id: "reward", title: "Reward", keys: ["reward_mean"], band: { std: "reward_std", min: "reward_min", max: "reward_max" },
      y: { title: "reward (mean, band)" } },
    { id: "accuracy", title: "Accuracy", keys: ["accuracy"], y: { title: "share correct (0–1)", rangemode: "tozero" } },
    { id: "loss", title: "Policy loss", keys: ["loss_policy"], y: { title: "loss (per token)", exponentformat: "e" } },
    { id: "kl", title: "KL", keys: ["kl"], y: { title: "KL (nats per token)", rangemode: "tozero", exponentformat: "e" } },
    { id: "entropy", title: "Entropy", keys: ["entropy"], y: { title: "entropy (nats per token)", rangemode: "tozero" } },
    { id: "clip", title: "Clip fraction", keys: ["clip_fraction"], y: { title: "share of tokens clipped", rangemode: "tozero" } },
    { id: "length", title: "Response length", keys: ["response_length_mean"], y: { title: "tokens", rangemode: "tozero" } },
    // Calls and turns together: a multi-turn agent that learns to keep using its tool shows both rising.
    { id: "tool_calls", title: "Tool calls and turns per trajectory", keys: ["tool_calls_mean"], lines: ["turns_mean"],
      y: { title: "calls, turns (mean per trajectory)", rangemode: "tozero" } },
    // Every kind of error per trajectory on one chart: a reward that raises (scored 0) is as plain as a tool
    // that fails or a call the parser could not read.
    { id: "tool_errors", title: "Errors per trajectory", keys: ["tool_errors_mean"], lines: ["parse_errors_mean", "reward_errors_fraction"],
      y: { title: "errors (mean per trajectory)", rangemode: "tozero" } },
    { id: "tokens_per_s", title: "Generation throughput", keys: ["tokens_per_second"], y: { title: "tokens / s", rangemode: "tozero" } },
    { id: "lr", title: "Learning rate", keys: ["lr"], y: { title: "learning rate", tickformat: ".1e", rangemode: "tozero" } },
    { id: "step_time", title: "Step time", keys: ["time_step"], lines: ["time_step_cpu"], skipStart: true,
      y: { title: "seconds (CPU: summed over processes)", rangemode: "tozero" } },
    { id: "stage_time", title: "Stage times", keys: [], prefix: "time_", exclude: TIME_ONE_OFF, skipStart: true,
      y: { title: "seconds per step", rangemode: "tozero" } },
    { id: "eval_time", title: "Evaluation and checkpoint time", keys: ["time_eval"], lines: ["time_checkpoint"],
      y: { title: "seconds", rangemode: "tozero" } },
    { id: "mismatch", title: "Rollout vs trainer logprob mismatch", keys: ["logprob_mismatch"],
      y: { title: "mean |Δ logprob| (nats per token)", rangemode: "tozero", exponentformat: "e" } },
    // Held-out evaluations (every `eval.every` steps and at the end), one chart per unit: no axis ever shows
    // a unit it does not hold. Shares and rewards (pass@1 = accuracy, pass@k, finish reasons) first.
    { id: "eval_tokens", title: "Evaluation: response length", keys: [], prefix: "eval_", only: /length/,
      y: { title: "tokens (held-out)", rangemode: "tozero" } },
    { id: "eval_counts", title: "Evaluation: turns and tool calls", keys: [], prefix: "eval_", only: /turns|calls|errors/,
      y: { title: "per trajectory (held-out)", rangemode: "tozero" } },
    // The number of problems is a count, not a share: on the 0–1 axis it would flatten every other line.
    { id: "eval", title: "Evaluation (held-out)", keys: ["eval_accuracy"], prefix: "eval_",
      drop: ["eval_reward_std", "eval_reward_min", "eval_reward_max", "eval_reward_errors_count"], y: { title: "share / reward (0–1)", rangemode: "tozero" },
      y2: { title: "problems", match: /^eval_problems$|^eval_sampled_n$/ } },
  ];

  /* The y axis of a chart no spec names: its unit guessed from the metric's name. */
  function guessAxis(key) {
    if (key.startsWith("time_")) return { title: "seconds", rangemode: "tozero" };
    if (/length/.test(key)) return { title: "tokens", rangemode: "tozero" };
    if (/fraction|accuracy|finish_/.test(key)) return { title: "share (0–1)", rangemode: "tozero" };
    if (/errors|calls|turns|count/.test(key)) return { title: "count", rangemode: "tozero" };
    // A loss or a norm: scientific notation, never SI prefixes ("5n" reads as a count of something).
    return { title: key.replace(/_/g, " "), exponentformat: "e" };
  }

  function lineLabel(def, key) {
    if (def.prefix && key.startsWith(def.prefix)) return key.slice(def.prefix.length);
    return key.replace(/^time_|_time$/g, "").replace(/_/g, " ");
  }

  /* Text for Plotly: its names, titles and hover labels read a subset of HTML (<a href>, <b>, <br>), so a
   * job named `<a href=...>` would become a link. Entities show the characters as written. */
  function plotText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  const PALETTE = ["#4f46e5", "#d93025", "#0f9d58", "#b7791f", "#2563eb", "#9333ea", "#0891b2", "#be185d"];

  function hexToRgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }

  /* One line = one metric of one series (a job): the stored values, and what is drawn from them. */
  class Line {
    constructor(series, metric, name, color, hasBand) {
      Object.assign(this, { series, metric, name, color, hasBand });
      this.x = []; this.y = []; this.std = []; this.min = []; this.max = [];
      this.pending = 0; // points stored but not drawn yet
      this.axis = "y"; // "y2": the chart's right-hand axis
      this.emaAcc = 0; this.emaN = 0;
    }
  }

  class MetricCharts {
    /* container: the element the known charts go in; options: {band: bool, extras: element for metrics
     * no known chart claims (default: the container), onDraw(chartId, div)} */
    constructor(container, options) {
      this.container = container;
      this.extras = (options && options.extras) || container;
      this.options = Object.assign({ band: true }, options || {});
      this.smoothing = false; this.weight = 0.6; this.logScale = false; this.bandKind = "std";
      this.charts = new Map(); // id -> {def, div, lines: [Line], dirty: bool}
      this.seriesNames = new Map();
      this.timer = null;
      this.live = [];
      this._only = null;
      this.firstStep = new Map(); // series -> the first step it was given
      this.startSteps = new Map(); // series -> Set of steps at which one of its runs started
      this.xMode = "step"; // or "time" (seconds since the series' first step) or "tokens" (trained so far)
      this.xmaps = new Map(); // series -> {time: Map(step -> s), tokens: Map(step -> n), t0, total}
      this.syncing = false; // a zoom or hover being copied to the other charts
      this.search = "";
      this.panelKey = `agentfly.panels.${this.options.user || "anonymous"}`;
      this.panels = readPanels(this.panelKey); // {pinned: [chart ids], hidden: [chart ids]}, per user
      this.extras.addEventListener("extras-opened", () => this.flush());
      for (const def of CHARTS) this._chart(def.id, def);
    }

    setSeriesName(series, name) { this.seriesNames.set(String(series), name); }

    /* Draw a history: `columns` is series.json's {metric: {x: [steps], y: [values]}}, each column already
     * downsampled on its own; points at the same step are one "event" for `add`. */
    load(series, columns, times) {
      if (times) times.x.forEach((step, i) => this._noteTime(series, step, times.y[i]));
      const byStep = new Map();
      for (const [key, col] of Object.entries(columns)) {
        if (key === "step") continue; // the x axis itself, skipped by numericMetrics too
        const k = normKey(key);
        for (let i = 0; i < col.x.length; i++) {
          if (col.y[i] === null) continue;
          let values = byStep.get(col.x[i]);
          if (!values) { values = {}; byStep.set(col.x[i], values); }
          values[k] = col.y[i];
        }
      }
      for (const step of [...byStep.keys()].sort((a, b) => a - b)) this.add(series, step, byStep.get(step));
    }

    /* A live metrics event (kept a while, so a zoomed chart redrawn from an older answer can replay it). */
    addLive(series, seq, step, values, time) {
      this._noteTime(series, step, time);
      this.live.push({ series, seq, step, values });
      if (this.live.length > LIVE_KEPT) this.live.splice(0, this.live.length - LIVE_KEPT);
      this.add(series, step, values);
    }

    _chartKeys(chart) {
      const keys = new Set(chart.lines.map((l) => l.metric));
      if (chart.def.band) for (const k of Object.values(chart.def.band)) keys.add(k);
      return keys;
    }

    /* Plotly's relayout after a zoom (x range) or a reset (autorange): reload that chart's lines. */
    async _zoomed(chart, event) {
      if (!this.options.fetchRange || this.xMode !== "step") return; // ranges of time or tokens: zoom as drawn
      let range = null;
      if (event["xaxis.range[0]"] !== undefined) range = [event["xaxis.range[0]"], event["xaxis.range[1]"]];
      else if (Array.isArray(event["xaxis.range"])) range = event["xaxis.range"];
      else if (!event["xaxis.autorange"]) return; // a y-axis or log-scale change: nothing to load
      const keys = this._chartKeys(chart);
      const request = (chart.zoomRequest || 0) + 1;
      chart.zoomRequest = request;
      const seriesIds = [...new Set(chart.lines.map((l) => l.series))];
      const answers = await Promise.all(seriesIds.map((series) => this.options.fetchRange(series, [...keys],
        range && [Math.floor(range[0]), Math.ceil(range[1])])));
      if (chart.zoomRequest !== request) return; // a newer zoom overtook this one
      seriesIds.forEach((series, i) => {
        const answer = answers[i];
        for (const line of chart.lines) {
          if (String(line.series) !== String(series)) continue;
          line.x = []; line.y = []; line.std = []; line.min = []; line.max = [];
        }
        const only = {};
        for (const [key, col] of Object.entries(answer.metrics)) if (keys.has(normKey(key))) only[key] = col;
        this._only = keys;
        this.load(series, only);
        for (const e of this.live) if (String(e.series) === String(series) && e.seq > answer.last_seq) this.add(series, e.step, e.values);
        this._only = null;
      });
      chart.zoomed = range !== null;
      chart.full = true;
      this.flush();
    }

    _chart(id, def) {
      let chart = this.charts.get(id);
      if (chart) return chart;
      const box = document.createElement("div");
      box.className = "chart"; box.hidden = true;
      box.dataset.chart = id;
      const div = document.createElement("div");
      div.id = `chart-${id}`; div.className = "plot"; div.dataset.points = "0";
      chart = { def, box, div, lines: [], index: new Map(), drawn: false, full: true, log: null, smooth: null };
      box.append(this._tools(chart), div);
      (def.extra ? this.extras : this.container).appendChild(box);
      this.charts.set(id, chart);
      this._applyPanel(chart);
      return chart;
    }

    _line(chart, series, metric, label, withBand, def) {
      const key = `${series}|${metric}`;
      let line = chart.index.get(key);
      if (line) return line;
      const multiSeries = this.seriesNames.size > 1;
      const name = multiSeries ? `${this.seriesNames.get(String(series)) || series}${label ? " · " + label : ""}` : (label || chart.def.title);
      const colorIndex = multiSeries ? [...this.seriesNames.keys()].indexOf(String(series)) : chart.lines.length;
      line = new Line(series, metric, name, PALETTE[(colorIndex + PALETTE.length) % PALETTE.length], withBand);
      if (def && def.y2 && def.y2.match.test(metric)) line.axis = "y2";
      chart.lines.push(line); chart.index.set(key, line);
      chart.full = true; // a new trace: redraw the chart once, then extend again
      return line;
    }

    /* The steps at which a run of `series` started (its own first step; for a resumed job also its parent's):
     * charts with `skipStart` leave those points out. */
    setStartSteps(series, steps) { this.startSteps.set(String(series), new Set(steps)); }

    _isStart(series, step) {
      const known = this.startSteps.get(String(series));
      if (known) return known.has(step);
      return this.firstStep.get(String(series)) === step;
    }

    /* Queue one metrics event's numbers for `series` at x = step. */
    add(series, step, values) {
      if (this._only) values = Object.fromEntries(Object.entries(values).filter(([k]) => this._only.has(k)));
      else {
        if (!this.firstStep.has(String(series))) this.firstStep.set(String(series), step);
        this._noteTokens(series, step, values);
      }
      const claimed = new Set();
      for (const def of CHARTS) {
        const chart = this.charts.get(def.id);
        const skip = def.skipStart && this._isStart(series, step);
        const key = def.keys.find((k) => k in values);
        if (key !== undefined) {
          claimed.add(key);
          const band = def.band && this.options.band && (def.band.std in values || def.band.min in values);
          // A chart of several lines names its main line by its key, the others by theirs.
          const many = Boolean(def.prefix || def.lines);
          if (!skip) this._push(this._line(chart, series, key, many ? lineLabel(def, key) : "", band, def), step, values[key], def.band ? values : null, def.band);
          if (def.band) for (const k of Object.values(def.band)) claimed.add(k);
        }
        const more = (def.lines || []).filter((k) => k in values);
        if (def.prefix) {
          for (const k of Object.keys(values)) {
            if (!k.startsWith(def.prefix) || def.keys.includes(k) || (def.exclude || []).includes(k) || claimed.has(k)) continue;
            if (def.only && !def.only.test(k)) continue;
            if ((def.drop || []).includes(k)) { claimed.add(k); continue; }
            more.push(k);
          }
        }
        for (const k of more) {
          claimed.add(k);
          if (!skip) this._push(this._line(chart, series, k, lineLabel(def, k), false, def), step, values[k]);
        }
      }
      for (const [k, v] of Object.entries(values)) {
        if (claimed.has(k)) continue;
        const chart = this._chart(`x-${k}`, { id: `x-${k}`, title: k, keys: [k], extra: true, y: guessAxis(k) });
        this._push(this._line(chart, series, k, "", false), step, v);
      }
      this._schedule();
    }

    _push(line, step, value, values, band) {
      line.x.push(step); line.y.push(value);
      if (band && values) {
        line.std.push(values[band.std] ?? null);
        line.min.push(values[band.min] ?? null);
        line.max.push(values[band.max] ?? null);
      }
      line.pending += 1;
    }

    _schedule() {
      if (this.timer === null) this.timer = setTimeout(() => { this.timer = null; this.flush(); }, FLUSH_MS);
    }

    extrasClosed() { const details = this.extras.closest("details"); return Boolean(details && !details.open); }

    _announceExtra(chart) {
      if (chart.announced) return;
      chart.announced = true;
      this.extras.dispatchEvent(new CustomEvent("chart-added", { bubbles: true }));
    }

    setSmoothing(on, weight) { this.smoothing = on; this.weight = weight; this._redrawAll(); }
    setBandKind(kind) { this.bandKind = kind; this._redrawAll(); }
    setLogScale(on) { this.logScale = on; this._redrawAll(); }

    /* A chart is drawn on a log axis only when asked and when it holds a positive value: an all-zero series
     * on a log axis is an empty 10–100 axis. */
    _axisType(chart) {
      return (chart.log ?? this.logScale) && chart.lines.some((l) => l.y.some((v) => v !== null && v > 0)) ? "log" : "linear";
    }

    /* A chart whose every line has one point (an evaluation run only at the end, the run's total time) is a
     * summary card, never a line chart of one point on a fractional axis; it becomes a chart at its second. */
    _summary(chart) {
      if (!chart.summaryBox) {
        chart.summaryBox = document.createElement("div");
        chart.summaryBox.className = "chart-summary";
        chart.box.insertBefore(chart.summaryBox, chart.div);
      }
      chart.box.classList.add("summary"); chart.div.hidden = true; chart.box.hidden = false;
      const rows = chart.lines.filter((l) => l.x.length).map((l) => el("tr", {},
        el("td", { text: l.name }),
        el("td", { class: "mono", text: fmt(l.y[0], 4) }), el("td", { class: "muted small", text: `step ${l.x[0]}` })));
      chart.summaryBox.replaceChildren(el("h3", { text: chart.def.title }),
        el("table", { class: "table compact" }, el("tbody", {}, ...rows)));
    }

    _redrawAll() { for (const chart of this.charts.values()) { chart.full = true; this._pressed(chart); } this.flush(); }

    /* A log axis cannot draw a value at or below 0 (a loss, an advantage, a smoothed rate that touched 0):
     * the chart says how many points it leaves out, and that the smoothed line is off, instead of hiding them
     * silently; a chart with no value above 0 stays linear and says so. */
    _logNote(chart) {
      const asked = chart.log ?? this.logScale;
      let text = "";
      if (asked) {
        let hidden = 0;
        for (const l of chart.lines) for (const v of l.y) if (v !== null && v !== undefined && v <= 0) hidden += 1;
        if (this._axisType(chart) !== "log") text = "Log scale off for this chart: it has no value above 0.";
        else if (hidden) {
          text = `Log scale: ${hidden} point${hidden === 1 ? "" : "s"} at or below 0 not drawn` +
            ((chart.smooth ?? this.smoothing) ? "; smoothing off (its line would pass through them)." : ".");
        }
      }
      if (!chart.note) {
        if (!text) return;
        chart.note = document.createElement("p");
        chart.note.className = "chart-note";
        chart.box.append(chart.note);
      }
      chart.note.textContent = text;
      chart.note.hidden = !text;
    }

    _band(line, i) {
      const y = line.y[i];
      if (y === null || y === undefined) return [null, null];
      if (this.bandKind === "minmax") return [line.min[i], line.max[i]];
      const s = line.std[i];
      return s === null || s === undefined ? [null, null] : [y - s, y + s];
    }

    _ema(line, value) {
      if (value === null || value === undefined) return null;
      line.emaAcc = this.weight * line.emaAcc + (1 - this.weight) * value;
      line.emaN += 1;
      return line.emaAcc / (1 - this.weight ** line.emaN);
    }

    _traces(line, chart) {
      const xs = line.x.map((step) => this._x(line.series, step));
      // Fixed order per line: [band low, band high,] raw, smoothed.
      const traces = [];
      const onAxis = (trace) => (line.axis === "y2" ? { ...trace, yaxis: "y2" } : trace);
      if (line.hasBand) {
        const lo = [], hi = [];
        for (let i = 0; i < line.x.length; i++) { const [a, b] = this._band(line, i); lo.push(a); hi.push(b); }
        traces.push({ x: xs, y: lo, mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false, name: "band" });
        traces.push({ x: xs, y: hi, mode: "lines", line: { width: 0 }, fill: "tonexty",
          fillcolor: hexToRgba(line.color, 0.15), hoverinfo: "skip", showlegend: false,
          name: this.bandKind === "minmax" ? "min/max" : "± std" });
      }
      line.emaAcc = 0; line.emaN = 0;
      const smooth = line.y.map((v) => this._ema(line, v));
      // On a log axis a rate that touches 0 has no smoothed curve worth drawing: the debiased EMA of
      // zeros decays towards 1e-20 and stretches the axis over twenty decades. The raw points stay.
      const smoothOn = chart.smooth ?? this.smoothing, logOn = chart.log ?? this.logScale;
      const smoothing = smoothOn && !(logOn && line.y.some((v) => v !== null && v <= 0));
      // Markers on short lines only: hundreds of SVG markers per chart are what makes a long job slow to draw.
      traces.push({ x: xs, y: line.y.slice(), mode: line.x.length > MAX_MARKERS ? "lines" : "lines+markers",
        meta: "raw", name: plotText(line.name), marker: { size: 4, color: line.color }, line: { color: line.color, width: 1.5 },
        opacity: smoothing ? 0.3 : 1 });
      traces.push({ x: xs, y: smooth, mode: "lines", name: plotText(`${line.name} (smoothed)`),
        line: { color: line.color, width: 2 }, visible: smoothing, showlegend: false });
      return traces.map(onAxis);
    }

    /* ---------------------------------------------------------------- x axis: step, wall time, trained tokens */
    _xmap(series) {
      let m = this.xmaps.get(String(series));
      if (!m) { m = { time: new Map(), tokens: new Map(), t0: null, total: 0 }; this.xmaps.set(String(series), m); }
      return m;
    }

    _noteTime(series, step, at) {
      if (typeof at !== "number" || typeof step !== "number") return;
      const m = this._xmap(series);
      if (m.time.has(step)) return;
      if (m.t0 === null) m.t0 = at;
      m.time.set(step, at - m.t0);
    }

    /* Tokens trained by the end of each step: the sampled (mask 1) tokens are what the update trains on,
     * tokens_per_second x the rollout stage's time of that step. */
    _noteTokens(series, step, values) {
      const tps = values.tokens_per_second, rollout = values.time_rollout;
      if (typeof tps !== "number" || typeof rollout !== "number") return;
      const m = this._xmap(series);
      if (m.tokens.has(step)) return;
      m.total += tps * rollout;
      m.tokens.set(step, Math.round(m.total));
    }

    _x(series, step) {
      if (this.xMode === "step") return step;
      const v = this._xmap(series)[this.xMode].get(step);
      return v === undefined ? null : v;
    }

    setXMode(mode) { this.xMode = X_TITLES[mode] ? mode : "step"; this._redrawAll(); }

    /* ------------------------------------------------ zoom and hover shown on every chart at once */
    _bind(chart) {
      chart.div.on("plotly_relayout", (event) => {
        if (!this.syncing) this._syncZoom(chart, event);
        this._zoomed(chart, event);
      });
      chart.div.on("plotly_hover", (event) => {
        if (this.syncing || !event.points || !event.points.length) return;
        const xval = event.points[0].x;
        this._others(chart, (c) => Plotly.Fx.hover(c.div, { xval }, "xy"));
      });
      chart.div.on("plotly_unhover", () => { if (!this.syncing) this._others(chart, (c) => Plotly.Fx.unhover(c.div)); });
    }

    _others(source, fn) {
      this.syncing = true;
      try {
        for (const c of this.charts.values()) {
          if (c !== source && c.drawn && c.div.data && c.div.offsetParent !== null) fn(c);
        }
      } finally { this.syncing = false; }
    }

    _syncZoom(source, event) {
      let update = null;
      if (event["xaxis.range[0]"] !== undefined) update = { "xaxis.range": [event["xaxis.range[0]"], event["xaxis.range[1]"]] };
      else if (Array.isArray(event["xaxis.range"])) update = { "xaxis.range": event["xaxis.range"].slice() };
      else if (event["xaxis.autorange"]) update = { "xaxis.autorange": true };
      if (!update) return;
      // Plotly fires plotly_relayout after the call returns: a chart already showing the range is left alone,
      // or the charts would copy the zoom back and forth for ever.
      const want = JSON.stringify(update["xaxis.range"] || null);
      this._others(source, (c) => {
        const axis = c.div.layout.xaxis || {};
        if (update["xaxis.autorange"] ? axis.autorange === true : JSON.stringify(axis.range) === want) return;
        Plotly.relayout(c.div, update);
      });
    }

    /* ------------------------------------- per chart: log scale, smoothing, download, pin, hide */
    _tools(chart) {
      const button = (action, text, title) => el("button", { type: "button", class: "chart-tool", "data-action": action, title, text });
      const tools = el("div", { class: "chart-tools" },
        button("log", "log", "log scale for this chart"), button("smooth", "smooth", "smoothing (debiased EMA) for this chart"),
        button("csv", "CSV", "download this chart's data as CSV"), button("json", "JSON", "download this chart's data as JSON"),
        button("pin", "pin", "pin this chart to the top (remembered)"), button("hide", "hide", "hide this chart (remembered)"));
      tools.addEventListener("click", (e) => {
        const action = e.target.dataset && e.target.dataset.action;
        if (!action) return;
        if (action === "log") chart.log = !(chart.log ?? this.logScale);
        else if (action === "smooth") chart.smooth = !(chart.smooth ?? this.smoothing);
        else if (action === "csv" || action === "json") { this.download(chart, action); return; }
        else if (action === "pin" || action === "hide") { this.togglePanel(chart.def.id, action === "pin" ? "pinned" : "hidden"); return; }
        chart.full = true; this._pressed(chart); this.flush();
      });
      return tools;
    }

    _pressed(chart) {
      const state = { log: chart.log ?? this.logScale, smooth: chart.smooth ?? this.smoothing,
        pin: this.panels.pinned.includes(chart.def.id), hide: this._isHidden(chart) };
      for (const b of chart.box.querySelectorAll(".chart-tool")) {
        if (b.dataset.action in state) b.setAttribute("aria-pressed", String(Boolean(state[b.dataset.action])));
      }
    }

    /* The chart's points as drawn (a long history comes downsampled: zoom in for every point of a range),
     * one row per step, one column per line. */
    chartData(chart) {
      const steps = new Set();
      for (const l of chart.lines) for (const x of l.x) steps.add(x);
      const order = [...steps].sort((a, b) => a - b);
      return { title: chart.def.title, x: this.xMode, lines: chart.lines.map((l) => ({
        name: l.name, metric: l.metric, series: l.series, step: l.x.slice(), x: l.x.map((s) => this._x(l.series, s)), value: l.y.slice() })),
        steps: order };
    }

    download(chart, kind) {
      const data = this.chartData(chart);
      let body, type;
      if (kind === "json") {
        body = JSON.stringify(data, null, 1); type = "application/json";
      } else {
        // A cell a spreadsheet would run as a formula (=, +, -, @) is quoted as text.
        const cell = (v) => {
          let t = v === null || v === undefined ? "" : String(v);
          if (typeof v === "string" && /^[=+\-@]/.test(t)) t = `'${t}`;
          return /[",\n]/.test(t) ? `"${t.replace(/"/g, '""')}"` : t;
        };
        const columns = data.lines.map((l) => new Map(l.step.map((s, i) => [s, l.value[i]])));
        const rows = [["step", ...data.lines.map((l) => l.name)].map(cell).join(",")];
        for (const s of data.steps) rows.push([s, ...columns.map((c) => c.get(s))].map(cell).join(","));
        body = rows.join("\n") + "\n"; type = "text/csv";
      }
      const a = el("a", { href: URL.createObjectURL(new Blob([body], { type })), download: `${chart.def.id}.${kind}` });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 1000);
    }

    _isHidden(chart) { return this.panels.hidden.includes(chart.def.id); }

    togglePanel(id, list) {
      const ids = this.panels[list];
      const at = ids.indexOf(id);
      if (at >= 0) ids.splice(at, 1); else ids.push(id);
      this._savePanels();
    }

    showAllPanels() { this.panels.hidden = []; this._savePanels(); }

    _savePanels() {
      try { localStorage.setItem(this.panelKey, JSON.stringify(this.panels)); } catch (err) { /* private mode: this page only */ }
      for (const chart of this.charts.values()) this._applyPanel(chart);
      this.flush();
    }

    _applyPanel(chart) {
      chart.box.classList.toggle("pinned", this.panels.pinned.includes(chart.def.id));
      chart.box.classList.toggle("panel-hidden", this._isHidden(chart));
      const q = this.search;
      const match = !q || chart.def.title.toLowerCase().includes(q) || chart.def.id.includes(q)
        || chart.lines.some((l) => l.metric.includes(q.replace(/[^a-z0-9]+/g, "_")));
      chart.box.classList.toggle("filtered-out", !match);
      this._pressed(chart);
      const count = document.getElementById("hidden-count");
      if (count) { count.textContent = String(this.panels.hidden.length); count.closest("button").hidden = !this.panels.hidden.length; }
    }

    setSearch(text) {
      this.search = text.trim().toLowerCase();
      for (const chart of this.charts.values()) this._applyPanel(chart);
      // A chart that comes into view is sized now (Plotly cannot measure a hidden one).
      for (const chart of this.charts.values()) if (chart.div.data && chart.div.offsetParent !== null) Plotly.Plots.resize(chart.div);
    }

    flush() {
      for (const [id, chart] of this.charts) {
        if (!chart.lines.length) continue;
        // Charts in the closed "More metrics" section are drawn when it opens (off screen, Plotly cannot
        // size them, and drawing them first would delay the charts the user is looking at).
        if (chart.def.extra && this.extrasClosed()) { chart.box.hidden = false; chart.full = true; this._announceExtra(chart); continue; }
        if (this._isHidden(chart)) { chart.box.hidden = false; chart.full = true; continue; } // drawn when shown again
        const pending = chart.lines.some((l) => l.pending > 0);
        if (!chart.full && !pending) continue;
        if ((chart.full || !chart.drawn) && chart.lines.every((l) => l.x.length <= 1)) {
          this._summary(chart);
          chart.drawn = false; chart.full = false;
          for (const l of chart.lines) l.pending = 0;
        } else if (chart.full || !chart.drawn) {
          if (chart.summaryBox) { chart.summaryBox.remove(); chart.summaryBox = null; chart.box.classList.remove("summary"); chart.div.hidden = false; }
          chart.box.hidden = false;
          const traces = chart.lines.flatMap((l) => this._traces(l, chart));
          const many = chart.lines.length > 1;
          const legendRows = many ? Math.ceil(chart.lines.length / 2) : 0;
          const y2 = chart.def.y2 && chart.lines.some((l) => l.axis === "y2");
          const layout = {
            title: { text: plotText(chart.def.title), font: { size: 14 }, x: 0.02, xanchor: "left" }, margin: { l: 62, r: y2 ? 62 : 12, t: 36, b: 40 + 18 * legendRows },
            height: 260 + 18 * legendRows, xaxis: { title: { text: X_TITLES[this.xMode], standoff: 2 } },
            hovermode: "x",
            yaxis: { ...axisLayout(chart.def.y || guessAxis(chart.def.keys[0] || "")), type: this._axisType(chart) },
            showlegend: many,
            legend: { orientation: "h", x: 0, y: -0.18, yanchor: "top", font: { size: 10 } }, uirevision: id,
          };
          if (y2) layout.yaxis2 = { ...axisLayout({ rangemode: "tozero", ...chart.def.y2 }), overlaying: "y", side: "right", showgrid: false };
          // No Plotly toolbar on a phone: its 20 px buttons are under the 24 px a finger needs (WCAG 2.2), and
          // the chart's own row of tools (log, smooth, CSV, ...) and a double tap (reset zoom) remain.
          Plotly.react(chart.div, traces, themed(layout), { displaylogo: false, responsive: true,
            displayModeBar: !window.matchMedia?.("(pointer: coarse), (max-width: 640px)")?.matches });
          if (!chart.bound) this._bind(chart);
          chart.bound = true;
          chart.drawn = true; chart.full = false;
          for (const l of chart.lines) l.pending = 0;
        } else {
          const update = { x: [], y: [] }, indices = [];
          let offset = 0;
          for (const l of chart.lines) {
            const n = l.pending, from = l.x.length - n;
            if (n > 0) {
              const xs = l.x.slice(from).map((step) => this._x(l.series, step)), ys = l.y.slice(from);
              if (l.hasBand) {
                const lo = [], hi = [];
                for (let i = from; i < l.x.length; i++) { const [a, b] = this._band(l, i); lo.push(a); hi.push(b); }
                update.x.push(xs, xs); update.y.push(lo, hi); indices.push(offset, offset + 1);
              }
              const base = offset + (l.hasBand ? 2 : 0);
              update.x.push(xs, xs); update.y.push(ys, ys.map((v) => this._ema(l, v))); indices.push(base, base + 1);
              l.pending = 0;
            }
            offset += l.hasBand ? 4 : 2;
          }
          if (indices.length) Plotly.extendTraces(chart.div, update, indices);
        }
        this._logNote(chart);
        if (this.search) this._applyPanel(chart);
        chart.div.dataset.points = String(chart.lines[0].x.length);
        chart.box.dataset.points = chart.div.dataset.points;
        document.getElementById("charts-empty")?.remove();
        if (chart.def.extra) this._announceExtra(chart);
        if (this.options.onDraw) this.options.onDraw(id, chart.div);
      }
    }
  }

  const X_TITLES = { step: "step", time: "wall time (s since the first step)", tokens: "trained tokens" };

  /* The user's pinned and hidden charts (localStorage, one key per user name). */
  function readPanels(key) {
    try {
      const value = JSON.parse(localStorage.getItem(key) || "{}");
      return { pinned: Array.isArray(value.pinned) ? value.pinned.map(String) : [],
        hidden: Array.isArray(value.hidden) ? value.hidden.map(String) : [] };
    } catch (err) { return { pinned: [], hidden: [] }; }
  }

  /* The page's colours (app.css's variables, light or dark as the system prefers) on a chart's layout: a
   * transparent background, the page's ink for text and its line colour for the grid. */
  function themed(layout) {
    const css = getComputedStyle(document.documentElement);
    const ink = css.getPropertyValue("--ink").trim() || "#1d2330", line = css.getPropertyValue("--line").trim() || "#e3e6eb";
    const out = { ...layout, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: ink } };
    // Only the axes the layout has: Plotly reads every axis key it is given, an undefined one included.
    for (const key of ["xaxis", "yaxis", "yaxis2"]) {
      out[key] = { ...(layout[key] || {}), gridcolor: line, zerolinecolor: line, linecolor: line };
      if (key === "yaxis2" && !layout.yaxis2) delete out[key];
    }
    return out;
  }

  /* A chart spec's axis as Plotly's layout writes it: the title (with its unit) is what every chart has. */
  function axisLayout(y) {
    const out = { title: { text: y.title, font: { size: 11 } }, automargin: true };
    if (y.rangemode) out.rangemode = y.rangemode;
    if (y.tickformat) out.tickformat = y.tickformat;
    if (y.exponentformat) out.exponentformat = y.exponentformat;
    return out;
  }

  /* ----------------------------------------------------------------------------- page helpers */
  function bindChartControls(charts) {
    const smooth = document.getElementById("smooth-toggle");
    const weight = document.getElementById("smooth-weight");
    const shown = document.getElementById("smooth-value");
    const logScale = document.getElementById("log-toggle");
    const search = document.getElementById("metric-search");
    const xAxis = document.getElementById("x-axis");
    const controls = { smooth, weight, logScale, search, xAxis };
    // A shared link opens the view it was copied from: the controls start from the URL, and every change is
    // written back to it (replaceState: no history entry per keystroke).
    viewFromUrl(controls);
    const update = () => { shown.textContent = Number(weight.value).toFixed(2); charts.setSmoothing(smooth.checked, Number(weight.value)); };
    const applyLog = () => { charts.setLogScale(logScale.checked); for (const c of charts.charts.values()) charts._pressed(c); };
    if (smooth.checked) update(); else shown.textContent = Number(weight.value).toFixed(2);
    if (logScale.checked) applyLog();
    if (search && search.value) charts.setSearch(search.value);
    if (xAxis && xAxis.value !== "step") charts.setXMode(xAxis.value);
    const remember = () => viewToUrl(controls);
    smooth.addEventListener("change", () => { update(); remember(); });
    weight.addEventListener("input", () => { update(); remember(); });
    logScale.addEventListener("change", () => { applyLog(); remember(); });
    if (search) search.addEventListener("input", () => { charts.setSearch(search.value); remember(); });
    if (xAxis) xAxis.addEventListener("change", () => { charts.setXMode(xAxis.value); remember(); });
    const showHidden = document.getElementById("show-hidden");
    if (showHidden) showHidden.addEventListener("click", () => charts.showAllPanels());
    const band = document.getElementById("band-kind");
    if (band) band.addEventListener("change", (e) => charts.setBandKind(e.target.value));
  }

  /* The chart view's URL parameters: x (step, time or tokens; step when absent), log=1, smooth=<EMA weight>
   * (smoothing on), q=<metric search>. Others (the compare page's jobs) are left as they are. */
  const VIEW_PARAMS = ["x", "log", "smooth", "q"];
  const MAX_SEARCH = 200;

  function viewFromUrl(c) {
    const q = new URLSearchParams(window.location.search);
    const x = q.get("x");
    if (c.xAxis && x !== null && [...c.xAxis.options].some((o) => o.value === x)) c.xAxis.value = x;
    if (q.get("log") === "1") c.logScale.checked = true;
    const w = q.get("smooth");
    if (w !== null && w.trim() !== "" && Number.isFinite(Number(w))) {
      c.smooth.checked = true;
      c.weight.value = String(Math.min(Number(c.weight.max), Math.max(Number(c.weight.min), Number(w))));
    }
    if (c.search && q.get("q")) c.search.value = q.get("q").slice(0, MAX_SEARCH);
  }

  function viewToUrl(c) {
    const q = new URLSearchParams(window.location.search);
    for (const name of VIEW_PARAMS) q.delete(name);
    if (c.xAxis && c.xAxis.value !== "step") q.set("x", c.xAxis.value);
    if (c.logScale.checked) q.set("log", "1");
    if (c.smooth.checked) q.set("smooth", Number(c.weight.value).toFixed(2));
    if (c.search && c.search.value.trim()) q.set("q", c.search.value.trim().slice(0, MAX_SEARCH));
    const query = q.toString();
    window.history.replaceState(window.history.state, "", `${window.location.pathname}${query ? `?${query}` : ""}${window.location.hash}`);
  }

  /* The collapsed "More metrics" section: every metric no known chart claims gets a chart there. Plotly
   * cannot size a chart inside a closed <details>, so the charts are resized when it opens. */
  function moreMetrics() {
    const details = document.getElementById("more-metrics");
    const box = document.getElementById("charts-extra");
    box.addEventListener("chart-added", () => {
      details.hidden = false;
      document.getElementById("more-count").textContent = `(${box.children.length})`;
    });
    details.addEventListener("toggle", () => {
      if (!details.open) return;
      box.dispatchEvent(new CustomEvent("extras-opened"));
      for (const plot of box.querySelectorAll(".plot")) if (plot.data) Plotly.Plots.resize(plot);
    });
    return box;
  }

  /* JSON of a same-origin URL; throws with the server's error message. */
  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    return body;
  }

  /* A zoom's request: the chart's metrics (normalised names) in the step range, at full resolution. */
  function rangeFetcher(seriesUrl) {
    return (keys, range) => {
      const q = new URLSearchParams({ keys: keys.join(","), points: "4000" });
      if (range) { q.set("from", String(range[0])); q.set("to", String(range[1])); }
      return getJSON(`${seriesUrl}?${q}`);
    };
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined) return "—";
    if (typeof value !== "number") return String(value);
    return Number.isInteger(value) ? String(value) : value.toFixed(digits ?? 3);
  }

  window.AgentFlyMonitor = { EventSocket, MetricCharts, themed, payload, numericMetrics, normKey, bindChartControls, moreMetrics, el, fmt, PALETTE, getJSON, rangeFetcher, axisLayout, plotText };
})();
