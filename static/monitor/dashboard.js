/* The dashboard of one job: metrics, live rollouts, resource pools and the worker, status and cancel.
 * Everything drawn here comes from the job's stored events (history, then live) through one EventSocket. */
(function () {
  "use strict";
  const M = window.AgentFlyMonitor;
  const { el, fmt } = M;
  const config = JSON.parse(document.getElementById("monitor-config").textContent);
  const MAX_TOKENS_SHOWN = 6000;
  const MAX_LOG = 300;

  let eventCount = 0;
  let totalSteps = config.total_steps;

  /* ---------------------------------------------------------------------------------- status + cancel */
  const badge = document.getElementById("job-status");
  const cancelButton = document.getElementById("cancel-button");

  // The job and its trainer share one status vocabulary (trainer/events.py RUN_STATES).
  let cancelRequested = cancelButton.textContent.trim().startsWith("Cancelling");

  // The Resume form is in the page, hidden, while the job runs (members only, never for a warm start job); it
  // shows once the job ends failed or cancelled with a checkpoint, as it would after a reload.
  const resumeForm = document.getElementById("resume-form");
  let resumeStep = resumeForm && resumeForm.querySelector("#resume-step").textContent.trim() !== ""
    ? Number(resumeForm.querySelector("#resume-step").textContent) : null;

  function setCheckpoint(step) {
    if (!resumeForm || typeof step !== "number") return;
    resumeStep = step;
    resumeForm.querySelector("#resume-step").textContent = String(step);
    setStatus(jobStatus);
  }

  // Every control follows the job's state (the model's TrainingJob.phase: its status, refined by a pending
  // cancel or yield, or by a later job that resumed it): Cancel while a cancel works (queued, running,
  // yielding, preempted: it asks first, in the words of that state), "Cancelling…" (disabled) once asked,
  // Resume once it ended failed or cancelled with a checkpoint and nothing resumed it yet.
  const ACTIVE = new Set(["queued", "running", "preempted"]);
  const CANCELLABLE = new Set(Object.keys(config.cancel_questions));
  const WAITING = new Set(["queued", "preempted"]);
  let jobStatus = badge.dataset.status;
  let jobPhase = badge.dataset.phase;
  function phaseOf(status, given) {
    if (given) return given;
    if (status === "running") return cancelRequested ? "cancelling" : jobPhase === "yielding" ? "yielding" : "running";
    if ((status === "failed" || status === "cancelled") && jobPhase === "resumed") return "resumed";
    return status;
  }
  function setStatus(status, cancelling, phase) {
    jobStatus = status;
    if (cancelling) cancelRequested = true;
    jobPhase = phaseOf(status, phase);
    if (resumeForm) resumeForm.hidden = !((status === "failed" || status === "cancelled") && resumeStep !== null && jobPhase !== "resumed");
    badge.className = `badge big ${status} ${jobPhase}`;
    badge.dataset.status = status;
    badge.dataset.phase = jobPhase;
    badge.textContent = config.phase_labels[jobPhase] || status;
    cancelButton.hidden = !(CANCELLABLE.has(jobPhase) || jobPhase === "cancelling");
    cancelButton.disabled = jobPhase === "cancelling";
    cancelButton.textContent = jobPhase === "cancelling" ? "Cancelling…" : "Cancel job";
    for (const id of ["job-queue-reason", "job-waiting"]) {
      const note = document.getElementById(id);
      if (note && !WAITING.has(status)) note.hidden = true;
    }
    if (!ACTIVE.has(status)) ended();
    showEta();
  }

  /* A job that has ended sends nothing more once its stored events are caught up: the "live" badge says
   * so, and the socket closes (a few seconds later, for events stored just after the final status). */
  let endTimer = null;
  function ended() {
    if (!state.socket || endTimer !== null || !state.caughtUp) return;
    endTimer = setTimeout(() => {
      state.socket.stop();
      connection.dataset.state = "ended";
      connection.textContent = `ended: ${jobStatus}`;
    }, state.endDelayMs);
  }

  /* ETA: the mean time of the last ETA_WINDOW steps times the steps left, while the job is active. */
  const ETA_WINDOW = 10;
  const stepTimes = []; // [step, seconds]
  let shownStep = config.step;
  function noteStepTime(step, seconds) {
    if (typeof seconds !== "number") return;
    stepTimes.push([step, seconds]);
    if (stepTimes.length > ETA_WINDOW) stepTimes.shift();
    showEta();
  }
  function showEta() {
    const eta = document.getElementById("job-eta");
    const left = totalSteps - shownStep;
    if (jobStatus !== "running" || !stepTimes.length || !(left > 0)) { eta.textContent = ""; return; }
    const seconds = (stepTimes.reduce((a, [, s]) => a + s, 0) / stepTimes.length) * left;
    const m = Math.floor(seconds / 60), sec = Math.round(seconds % 60);
    eta.textContent = `ETA ${m ? `${m} min ` : ""}${sec} s`;
    eta.dataset.seconds = String(Math.round(seconds));
  }

  function setStep(step) {
    if (typeof step !== "number") return;
    shownStep = step;
    showEta();
    document.getElementById("job-step").textContent = `step ${step} / ${totalSteps}`;
    if (totalSteps) document.getElementById("job-progress").style.width = `${Math.min(100, (100 * step) / totalSteps)}%`;
  }

  cancelButton.addEventListener("click", async () => {
    // As the job page does: one tap never stops training unasked.
    if (!window.confirm(config.cancel_questions[jobPhase] || `Cancel job #${config.id}?`)) return;
    cancelRequested = true;
    cancelButton.disabled = true;
    cancelButton.textContent = "Cancelling…";
    try {
      const response = await fetch(config.cancel_url, {
        method: "POST", credentials: "same-origin", redirect: "manual",
        headers: { "X-CSRFToken": cancelButton.dataset.csrf, "X-Requested-With": "fetch" },
      });
      // The view redirects to the job page (opaque here); anything else is an error worth showing.
      if (response.type !== "opaqueredirect" && !response.ok) throw new Error(`HTTP ${response.status}`);
    } catch (err) {
      cancelRequested = false;
      setStatus(jobStatus, false, jobPhase === "cancelling" ? null : jobPhase);
      appendLog({ seq: "", type: "log", data: { level: "error", message: `cancel failed: ${err.message}` } });
    }
  });

  /* ------------------------------------------------------------------------------ reward errors */
  // The banner the page renders when a reward raised (the trainer logs the first error's traceback once, as
  // a warning); live, it appears with that warning and follows each step's share of raised rewards.
  const rewardBanner = document.getElementById("reward-errors");
  function showRewardErrors(event) {
    const d = M.payload(event);
    if (!rewardBanner.hidden) return; // the first traceback stays
    document.getElementById("reward-errors-message").textContent = d.message || "";
    document.getElementById("reward-errors-traceback").textContent = d.traceback;
    rewardBanner.hidden = false;
  }
  function showRewardShare(step, share) {
    if (rewardBanner.hidden && !(share > 0)) return;
    document.getElementById("reward-errors-share").textContent =
      `At step ${step}, ${Math.round(100 * share)}% of the rollouts' rewards raised and scored 0.`;
  }

  /* ------------------------------------------------------------------------------------------ log */
  const logList = document.getElementById("log-list");
  function appendLog(event) {
    const d = M.payload(event);
    // The worker also logs each checkpoint the trainer's own checkpoint event announces (the job page lists
    // log lines only): one line per checkpoint here.
    if (event.type === "log" && (d.checkpoint || /^checkpoint saved at step \d+/.test(d.message || ""))) return;
    let text = d.message;
    if (event.type === "status") text = `status → ${d.state}${d.message ? " · " + d.message : ""}`;
    else if (event.type === "checkpoint") text = `checkpoint of step ${d.step} saved in ${d.path}${d.score === null ? "" : ` (score ${fmt(d.score, 3)})`}`;
    logList.append(el("li", { class: `lvl-${d.level || event.type}` }, el("span", { class: "muted", text: `#${event.seq} ` }), text));
    while (logList.children.length > MAX_LOG) logList.firstChild.remove();
  }

  /* ------------------------------------------------------------------------------------- rollouts */
  // Sample events are listed by step (`sampleIndex`, from series.json, then live stubs) and fetched one at
  // a time, when shown: a long job's trajectories would be hundreds of megabytes.
  const sampleIndex = []; // [step, seq] in seq order
  let trajectories = []; // the shown step's: {key, seq, step, index, t}
  let selectedKey = null;
  let followNewest = true;
  let shownSeq = null, loadingSeq = null, wantedSeq = null;
  const stepInput = document.getElementById("sample-step");
  const followBox = document.getElementById("sample-follow");
  const orderSelect = document.getElementById("sample-order");
  const rewardMin = document.getElementById("sample-reward-min");
  const rewardMax = document.getElementById("sample-reward-max");
  const failedOnly = document.getElementById("sample-failed");
  const infraOnly = document.getElementById("sample-infra");
  const list = document.getElementById("rollout-list");
  const view = document.getElementById("rollout-view");

  // A samples payload is {"trajectories": [Trajectory.to_dict(tokenizer), ...]}.
  function toolErrors(t) { return t.tool_errors; }
  // A trajectory the infrastructure ended (a killed sandbox, a lost node, a server down) carries `failure` (its
  // kind) and `failure_reason`; the trainer leaves it out of its group's statistics and out of the loss.
  function infraFailed(t) { return typeof t.failure === "string" && t.failure !== ""; }
  const rewardOf = (i) => (typeof i.t.reward === "number" ? i.t.reward : -Infinity);

  /* The turn rewards of a trajectory summed per turn (Trajectory.rewards_per_turn), with their reasons:
   * Map(turn index -> {value, reasons}); empty when it has none. */
  function turnRewards(t) {
    const out = new Map();
    for (const r of Array.isArray(t.turn_rewards) ? t.turn_rewards : []) {
      if (!r || typeof r.turn !== "number" || typeof r.value !== "number") continue;
      const entry = out.get(r.turn) || { value: 0, reasons: [] };
      entry.value += r.value;
      if (r.reason) entry.reasons.push(`${r.reason} ${signed(r.value)}`);
      out.set(r.turn, entry);
    }
    return out;
  }
  function signed(value) { return `${value > 0 ? "+" : ""}${fmt(value, 3)}`; }
  /* The reward credited to one turn, shown beside it ("turn reward +0.25 · found k1 +0.25"); null for none. */
  function turnRewardBadge(entry) {
    if (!entry) return null;
    return el("span", { class: `turn-reward ${entry.value > 0 ? "pos" : entry.value < 0 ? "neg" : "zero"}`,
      text: `turn reward ${signed(entry.value)}${entry.reasons.length ? " · " + entry.reasons.join(", ") : ""}` });
  }

  function indexSamples(step, seq, follow) {
    sampleIndex.push([step, seq]);
    stepInput.max = String(step);
    if (sampleIndex.length === 1) stepInput.min = String(step);
    if (follow !== false && followBox.checked) showSeq(seq);
  }

  /* The sample event of `step` (the newest at or before it), or the first after it. */
  function seqOfStep(step) {
    let best = null;
    for (const [s, seq] of sampleIndex) { if (s <= step) best = seq; else { if (best === null) best = seq; break; } }
    return best;
  }

  async function showSeq(seq) {
    wantedSeq = seq;
    if (loadingSeq !== null || seq === shownSeq) return; // one fetch at a time; the newest wish wins
    loadingSeq = seq;
    try {
      const event = await M.getJSON(`${config.event_url}${seq}.json`);
      trajectories = M.payload(event).trajectories.map((t, index) => ({ key: `${event.seq}:${index}`, seq: event.seq, step: event.step, index, t }));
      shownSeq = seq;
      if (followBox.checked) stepInput.value = String(event.step);
      list.dataset.seq = String(seq);
      rolloutsDirty = true;
      renderRollouts();
    } catch (err) {
      list.replaceChildren(el("li", { class: "empty", text: `could not load the samples of #${seq}: ${err.message}` }));
    } finally {
      loadingSeq = null;
      if (wantedSeq !== shownSeq && wantedSeq !== seq) showSeq(wantedSeq);
    }
  }

  /* The shown step's trajectories that pass the filters (reward within [min, max], only those with a failed
   * tool call, only those the infrastructure ended), in the chosen order. */
  function visibleTrajectories() {
    const reward = rewardOf;
    const order = (a, b) => a.index - b.index;
    const lo = rewardMin.value === "" ? -Infinity : Number(rewardMin.value);
    const hi = rewardMax.value === "" ? Infinity : Number(rewardMax.value);
    const needle = searchText.toLowerCase();
    const items = trajectories.filter((i) => reward(i) >= lo && reward(i) <= hi
      && (!failedOnly.checked || toolErrors(i.t) > 0 || i.t.tool_calls.some((c) => c.error))
      && (!infraOnly.checked || infraFailed(i.t))
      && (!needle || JSON.stringify(i.t).toLowerCase().includes(needle)));
    switch (orderSelect.value) {
      case "best": items.sort((a, b) => reward(b) - reward(a) || order(a, b)); break;
      case "worst": items.sort((a, b) => reward(a) - reward(b) || order(a, b)); break;
      default: items.sort(order);
    }
    return items;
  }

  let rolloutsDirty = false;
  function renderRollouts() {
    if (!rolloutsDirty) return;
    rolloutsDirty = false;
    const items = visibleTrajectories();
    document.getElementById("sample-count").textContent = `${items.length} of ${trajectories.length} at this step · ${sampleIndex.length} steps with samples`;
    drawHistogram();
    list.replaceChildren();
    if (!items.length) {
      list.append(el("li", { class: "empty", text: trajectories.length ? "No trajectory matches this filter." : "No sample trajectories yet." }));
      return;
    }
    if (followNewest || !items.some((i) => i.key === selectedKey)) selectedKey = items[0].key;
    for (const item of items) {
      const t = item.t;
      const errors = toolErrors(t);
      const li = el("li", { class: `rollout-item${item.key === selectedKey ? " selected" : ""}`, "data-key": item.key },
        el("span", { class: "reward " + (t.reward > 0 ? "pos" : "zero"), text: fmt(t.reward, 2) }),
        el("span", { text: ` step ${item.step ?? "?"} · ${plural(t.num_turns, "turn")} · ${plural(t.tool_calls.length, "call")}` }),
        errors ? el("span", { class: "badge failed", text: `${errors} failed` }) : null,
        infraFailed(t) ? el("span", { class: "badge infra", title: t.failure_reason || "", text: `left out: ${t.failure}` }) : null);
      li.addEventListener("click", () => { selectedKey = item.key; followNewest = false; rolloutsDirty = true; renderRollouts(); });
      list.append(li);
    }
    const selected = items.find((i) => i.key === selectedKey);
    if (selected && view.dataset.key !== selected.key) renderTrajectory(selected);
  }

  function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

  function contentText(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map((c) => (typeof c === "string" ? c : c.text || JSON.stringify(c))).join("");
    return content === null || content === undefined ? "" : JSON.stringify(content);
  }

  function renderTrajectory(item, target) {
    const t = item.t;
    const side = Boolean(target); // a column of the side-by-side view: no token view there
    if (!side) view.dataset.key = item.key;
    const failed = infraFailed(t);
    const head = el("div", { class: "traj-head" },
      el("span", { class: "badge big " + (t.reward > 0 && !failed ? "succeeded" : "neutral"), text: `reward ${fmt(t.reward, 3)}` }),
      el("span", { class: "muted", text: ` step ${item.step ?? "?"} · ${t.finish_reason || ""}${t.error && !failed ? " · error: " + t.error : ""}` }));
    // Not the agent's doing: said plainly, so nobody reads its reward as the policy's.
    const failure = failed ? el("div", { class: "infra-failure", role: "note" },
      el("span", { class: "badge infra", text: `infrastructure failure: ${t.failure}` }),
      el("strong", { text: " left out of training: infrastructure failure" }),
      el("div", { class: "infra-reason", text: t.failure_reason || t.error || "no reason was recorded" })) : null;
    const perTurn = turnRewards(t);
    const turnCount = (t.turns || []).length || t.num_turns || 0;
    const conversation = el("div", { class: "conversation" });
    const calls = t.tool_calls;
    const messages = t.messages;
    if (messages.length) {
      // The rollout's assistant messages are its turns, in order, after any the prompt held itself.
      let assistantIndex = -messages.filter((m) => m.role === "assistant").length + turnCount;
      for (const m of messages) {
        const turn = m.role === "assistant" ? assistantIndex++ : -1;
        const body = el("div", { class: "msg-body" }, el("pre", { text: contentText(m.content) }),
          turn >= 0 ? turnRewardBadge(perTurn.get(turn)) : null);
        for (const call of m.tool_calls || []) {
          const fn = call.function || call;
          body.append(el("div", { class: "tool-call" }, el("strong", { text: `→ ${fn.name}` }),
            el("code", { text: ` ${typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments)}` })));
        }
        conversation.append(el("div", { class: `turn role-${m.role}` }, el("div", { class: "role", text: m.role }), body));
      }
    } else if (!(t.turns || []).length && (t.segments || []).length) {
      // The trainer's samples carry the decoded mask spans: forced text (prompt, tool output) and sampled text.
      for (const s of t.segments) {
        const role = s.mask ? "assistant" : "context";
        conversation.append(el("div", { class: `turn role-${s.mask ? "assistant" : "tool"}` }, el("div", { class: "role", text: role }),
          el("div", { class: "msg-body" }, el("pre", { text: s.text }))));
      }
      if (perTurn.size) conversation.append(turnRewardList(perTurn));
    } else {
      for (const turn of t.turns || []) {
        // Numbered from 1, as the list's "2 turns" counts them (the trajectory stores 0-based indices).
        conversation.append(el("div", { class: "turn role-assistant" }, el("div", { class: "role", text: `turn ${turn.index + 1}` }),
          el("div", { class: "msg-body" }, el("pre", { text: turn.text }), turnRewardBadge(perTurn.get(turn.index)))));
      }
    }
    const callTable = el("table", { class: "table tool-calls" },
      el("thead", {}, el("tr", {}, ...["turn", "tool", "arguments", "observation", "ms"].map((h) => el("th", { text: h })))));
    const tbody = el("tbody");
    for (const c of calls) {
      tbody.append(el("tr", { class: c.error ? "call-error" : "" }, el("td", { text: typeof c.turn === "number" ? String(c.turn + 1) : fmt(c.turn) }), el("td", { text: c.name }),
        el("td", {}, el("code", { text: typeof c.arguments === "string" ? c.arguments : JSON.stringify(c.arguments) })),
        el("td", {}, el("pre", { text: c.error ? `error: ${c.error}` : contentText(c.observation) })),
        el("td", { text: fmt((c.latency || 0) * 1000, 1) })));
    }
    callTable.append(tbody);
    const answer = el("div", { class: "final-answer" }, el("strong", { text: "Final answer: " }),
      el("code", { text: t.final_answer ?? "—" }), el("span", { class: "muted", text: `  reward ${fmt(t.reward, 3)}` }));
    // What the reward attached for people to read (a coding agent's diff and its test report), by name.
    const artifacts = Object.entries(t.artifacts || {}).map(([name, text]) => el("details", { class: `artifact artifact-${name}`, open: "" },
      el("summary", { text: name }), el("pre", { text: text || "(empty)" })));
    const parts = [head, failure, conversation, calls.length ? callTable : el("p", { class: "muted", text: "No tool calls." }), answer,
      ...artifacts].filter((p) => p !== null);
    if (side) target.replaceChildren(...parts);
    else view.replaceChildren(...parts, el("h3", { text: "Tokens" }), tokenView(t));
  }

  /* The turn rewards as a list, for a trajectory shown as mask spans (no turn of its own to stand beside). */
  function turnRewardList(perTurn) {
    const items = [...perTurn.keys()].sort((a, b) => a - b)
      .map((k) => el("li", {}, el("span", { text: `turn ${k + 1}: ` }), turnRewardBadge(perTurn.get(k))));
    return el("div", { class: "turn-rewards" }, el("strong", { text: "Turn rewards" }), el("ul", {}, ...items));
  }

  /* Trained tokens (loss mask 1, sampled by the model) and forced tokens (mask 0: prompt, tool output,
   * template glue) coloured apart; hover a token for its id and sampling logprob. */
  function tokenView(t) {
    const box = el("div", { class: "tokens", id: "token-view" });
    const legend = el("div", { class: "token-legend" }, el("span", { class: "tok m1", text: "trained (mask 1)" }),
      el("span", { class: "tok m0", text: "masked (mask 0)" }));
    const ids = t.token_ids || [], mask = t.loss_mask || [], lps = t.logprobs || [];
    if (Array.isArray(t.tokens) && t.tokens.length) {
      const n = Math.min(t.tokens.length, MAX_TOKENS_SHOWN);
      const frag = document.createDocumentFragment();
      for (let i = 0; i < n; i++) {
        const m = mask[i] ? 1 : 0;
        const title = `#${i} id ${ids[i] ?? "?"} · mask ${m}` + (m ? ` · logprob ${fmt(lps[i], 4)}` : "");
        frag.append(el("span", { class: `tok m${m}`, title, "data-logprob": m ? String(lps[i]) : null, text: t.tokens[i] }));
      }
      box.append(frag);
      if (t.tokens.length > n) box.append(el("div", { class: "muted", text: `… ${t.tokens.length - n} more tokens` }));
    } else if (Array.isArray(t.segments) && t.segments.length) {
      for (const s of t.segments) {
        const lp = lps.slice(s.start, s.end);
        const mean = lp.length ? lp.reduce((a, b) => a + b, 0) / lp.length : null;
        box.append(el("span", { class: `tok m${s.mask ? 1 : 0}`, title: `tokens ${s.start}–${s.end} · mask ${s.mask}` + (s.mask ? ` · mean logprob ${fmt(mean, 4)}` : ""), text: s.text }));
      }
    } else {
      box.append(el("div", { class: "empty", text: "This trajectory was stored without token texts." }));
    }
    return el("div", {}, legend, box);
  }

  /* ------------------------------------------ search, reward histogram, best vs worst of a group */
  let searchText = "";
  const searchResults = document.getElementById("sample-search-results");
  document.getElementById("sample-search-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    searchText = document.getElementById("sample-search").value.trim();
    rolloutsDirty = true;
    if (!searchText) { searchResults.replaceChildren(); renderRollouts(); return; }
    searchResults.textContent = "searching…";
    try {
      const answer = await M.getJSON(`${config.search_url}?${new URLSearchParams({ q: searchText })}`);
      searchResults.replaceChildren(answer.matches.length ? `"${answer.q}" in ${answer.matches.length} step${answer.matches.length === 1 ? "" : "s"}${answer.more ? "+" : ""}: ` : `"${answer.q}" is in no stored trajectory`,
        ...answer.matches.slice(0, 30).map((m) => {
          const b = el("button", { type: "button", class: "btn small search-hit", "data-seq": String(m.seq), text: `step ${m.step} (${m.count})` });
          b.addEventListener("click", () => { followBox.checked = false; followNewest = true; showSeq(m.seq); });
          return b;
        }));
      if (answer.matches.length) { followBox.checked = false; followNewest = true; showSeq(answer.matches[0].seq); }
    } catch (err) { searchResults.textContent = `search failed: ${err.message}`; }
    renderRollouts();
  });

  /* The shown step's rewards as a histogram: how the group's rollouts spread, which a mean hides. */
  function drawHistogram() {
    // A trajectory the infrastructure ended has no reward of the policy's: it is left out, as in training.
    const left = trajectories.filter((i) => infraFailed(i.t)).length;
    const rewards = trajectories.filter((i) => !infraFailed(i.t)).map((i) => i.t.reward).filter((r) => typeof r === "number");
    if (!rewards.length) return;
    const step = trajectories[0].step;
    const note = left ? `; ${left} left out: infrastructure failure` : "";
    Plotly.react("reward-histogram", [{ type: "histogram", x: rewards, marker: { color: "#4f46e5" }, nbinsx: 20, name: "reward" }], M.themed({ height: 170, margin: { l: 50, r: 10, t: 28, b: 36 }, bargap: 0.05,
        title: { text: `rewards at step ${step} (${rewards.length} trajectories${note})`, font: { size: 12 }, x: 0.02, xanchor: "left" },
        xaxis: { title: { text: "reward", font: { size: 11 } } }, yaxis: yTitle("trajectories") }),
      { displaylogo: false, responsive: true });
  }

  /* The best and the worst trajectory of the selected one's group (same prompt), side by side. */
  document.getElementById("best-worst").addEventListener("click", () => {
    const box = document.getElementById("side-by-side");
    const selected = trajectories.find((i) => i.key === selectedKey);
    if (!selected) return;
    const group = selected.t.group_id;
    const inGroup = trajectories.filter((i) => group === undefined || i.t.group_id === group);
    // Best and worst of what was trained on: a trajectory the infrastructure ended says nothing of the policy.
    const scored = inGroup.filter((i) => !infraFailed(i.t));
    const members = scored.length ? scored : inGroup;
    const reward = rewardOf;
    const best = members.reduce((a, b) => (reward(b) > reward(a) ? b : a));
    const worst = members.reduce((a, b) => (reward(b) < reward(a) ? b : a));
    const column = (item, label) => {
      const c = el("div", { "data-key": item.key }, el("h3", { text: `${label}: reward ${fmt(item.t.reward, 3)}` }));
      const body = el("div");
      renderTrajectory(item, body);
      c.append(body);
      return c;
    };
    box.hidden = false;
    box.replaceChildren(column(best, "best of its group"), column(worst, "worst of its group"));
  });

  stepInput.addEventListener("change", () => {
    followBox.checked = false; followNewest = true;
    const seq = seqOfStep(Number(stepInput.value));
    if (seq !== null) showSeq(seq);
  });
  followBox.addEventListener("change", () => {
    if (followBox.checked && sampleIndex.length) showSeq(sampleIndex[sampleIndex.length - 1][1]);
  });
  for (const control of [orderSelect, rewardMin, rewardMax, failedOnly, infraOnly]) {
    control.addEventListener(control === rewardMin || control === rewardMax ? "input" : "change",
      () => { followNewest = true; rolloutsDirty = true; renderRollouts(); });
  }

  /* ------------------------------------------------------------------------------------ resources */
  // Each timeline line is its own {t, y}: the history's columns are downsampled one by one.
  const poolHistory = new Map(); // name -> {in_use: {t, y}, peak_in_use: {t, y}, waiting: {t, y}}
  const workerHistory = { cpu: { t: [], y: [] }, mem: { t: [], y: [] }, gpus: new Map() }; // gpu -> {util, mem}
  const engineHistory = new Map(); // Engine.stats() counter -> {t, y}
  let latestResources = null;
  let resourcesDirty = false;

  function line(map, key, ...fields) {
    if (!map.has(key)) map.set(key, Object.fromEntries(fields.map((f) => [f, { t: [], y: [] }])));
    return map.get(key);
  }

  function push(series, t, value) { series.t.push(t); series.y.push(value ?? null); }

  /* series.json's resource columns: host/cpu_percent, gpu/<i>/util_percent, pool/<name>/in_use, ... */
  function loadResources(columns, latest) {
    for (const [key, col] of Object.entries(columns)) {
      const t = col.x.map((s) => new Date(s * 1000));
      const parts = key.split("/");
      let target = null;
      if (key === "host/cpu_percent") target = workerHistory.cpu;
      else if (key === "host/memory_percent") target = workerHistory.mem;
      else if (parts[0] === "gpu") target = line(workerHistory.gpus, parts[1], "util", "mem")[parts[2] === "util_percent" ? "util" : "mem"];
      else if (parts[0] === "pool") target = line(poolHistory, parts.slice(1, -1).join("/"), "in_use", "peak_in_use", "waiting")[parts[parts.length - 1]];
      else if (parts[0] === "engine") target = line(engineHistory, parts[1], "value").value;
      if (target) { target.t = t; target.y = col.y.slice(); }
    }
    if (latest) setLatestResources(latest);
  }

  function setLatestResources(event) {
    const p = M.payload(event);
    latestResources = { pools: p.pools, worker: p.host, engine: p.engine };
    resourcesDirty = true;
  }

  function addResources(event) {
    // A resources payload is {"host": HostStats, "engine": Engine.stats(), "pools": ResourceEngine.stats()}.
    const p = M.payload(event);
    const t = new Date((event.time || Date.now() / 1000) * 1000);
    for (const [name, s] of Object.entries(p.pools)) {
      const h = line(poolHistory, name, "in_use", "peak_in_use", "waiting");
      push(h.in_use, t, s.in_use); push(h.peak_in_use, t, s.peak_in_use); push(h.waiting, t, s.waiting);
    }
    for (const [name, value] of Object.entries(p.engine || {})) push(line(engineHistory, name, "value").value, t, value);
    push(workerHistory.cpu, t, p.host.cpu_percent);
    push(workerHistory.mem, t, p.host.memory_percent);
    p.host.gpus.forEach((g) => {
      const h = line(workerHistory.gpus, String(g.index), "util", "mem");
      push(h.util, t, g.util_percent); push(h.mem, t, g.memory_percent);
    });
    setLatestResources(event);
  }

  // Plotly.react compares data arrays by identity: a trace handed the same (grown) array again is not
  // redrawn, which froze the timelines on their first sample. Each render passes fresh copies.
  function trace(series, extra) { return { x: series.t.slice(), y: series.y.slice(), mode: "lines", ...extra }; }

  const yTitle = (text, extra) => ({ title: { text, font: { size: 11 } }, rangemode: "tozero", automargin: true, ...extra });

  /* A job without resource pools (no sandboxed tools): the panel shows what its rollout engine did instead,
   * Engine.stats()'s counters since the engine was built, and how the main ones grew. */
  function renderEngine(engine) {
    const box = document.getElementById("engine-panel");
    const names = Object.keys(engine || {});
    box.hidden = !names.length;
    if (!names.length) return;
    const label = (k) => k.replace(/_/g, " ");
    const rows = names.map((k) => el("tr", {}, el("td", { text: label(k) }),
      el("td", { class: "num", text: fmt(engine[k], k.endsWith("seconds") || k.endsWith("second") ? 1 : 3) })));
    document.getElementById("engine-table").replaceChildren(el("table", { class: "table small", id: "engine-stats" },
      el("thead", {}, el("tr", {}, el("th", { text: "rollout engine" }), el("th", { text: "since start" }))),
      el("tbody", {}, ...rows)));
    const traces = [];
    const tokens = engineHistory.get("generated_tokens"), sequences = engineHistory.get("sequences");
    if (tokens) traces.push(trace(tokens.value, { name: "generated tokens" }));
    if (sequences) traces.push(trace(sequences.value, { name: "sequences", yaxis: "y2", line: { dash: "dot" } }));
    if (traces.length) {
      Plotly.react("engine-timeline", traces, M.themed({ height: 200, margin: { l: 56, r: 56, t: 10, b: 30 },
        yaxis: yTitle("tokens generated (total)"), yaxis2: yTitle("sequences (total)", { overlaying: "y", side: "right", showgrid: false }),
        legend: { orientation: "h", y: -0.3 } }), { displaylogo: false, responsive: true });
    }
  }

  /* A rate-limited API's pool (SharedRateLimiter): its shared counters, as last read from Redis, under its row:
     calls, waits, 429s, the daily quota in use and the circuit breaker's state. */
  function apiRow(s) {
    const a = s.kind === "api" ? s.isolation : null;
    if (!a || a.calls === undefined) return [];
    const quota = a.daily_quota ? `${fmt(a.quota_used)} / ${fmt(a.daily_quota)} today` : `${fmt(a.quota_used)} today (no quota)`;
    const text = `${fmt(a.calls)} calls · ${fmt(a.waits)} waits (${fmt(a.wait_seconds, 1)} s) · ${fmt(a.http_429)} × 429 · ` +
      `${fmt(a.failures)} failures · quota ${quota} · ${fmt(a.rate_per_s)}/s, ${fmt(a.concurrency)} at once`;
    return [el("tr", { class: "pool-api" }, el("td", { text: "  API" }),
      el("td", { colspan: "6", text }),
      el("td", { class: a.breaker === "open" ? "bad" : "", text: `breaker ${a.breaker}` }))];
  }

  /* A model service's pool (a judge, a reward model): the service's own figures under its row, as its stats()
     reports them: calls, batches and their sizes, latency from queueing to the verdict, and a judge's replies
     that held no verdict (parse failures, each also a trajectory's reward error). */
  function serviceRow(s) {
    const v = s.service;
    if (!v || v.calls === undefined) return [];
    const mean = v.batch_mean ?? (v.batches ? v.calls / v.batches : 0);
    let text = `${fmt(v.calls)} calls · ${fmt(v.batches)} batches (mean size ${fmt(mean, 1)}, max ${fmt(v.max_batch)}) · ` +
      `latency p50 ${fmt(v.latency_p50_ms, 1)} ms, p99 ${fmt(v.latency_p99_ms, 1)} ms`;
    if (v.in_flight !== undefined) text += ` · ${fmt(v.in_flight)} in flight (max ${fmt(v.max_in_flight)})`;
    if (v.errors) text += ` · ${fmt(v.errors)} errors`;
    const failures = v.parse_failures;
    return [el("tr", { class: "pool-service" }, el("td", { text: "  service" }),
      el("td", { colspan: "6", text }),
      el("td", { class: failures ? "bad" : "", text: failures === undefined ? "" : `${fmt(failures)} parse failures` }))];
  }

  function renderResources() {
    if (!resourcesDirty || !latestResources) return;
    resourcesDirty = false;
    const { pools, worker, engine } = latestResources;
    const names = Object.keys(pools);
    document.getElementById("pools-empty").hidden = names.length > 0;
    renderEngine(names.length ? {} : engine);
    if (names.length) {
      const fields = [["size", "#94a3b8"], ["in_use", "#4f46e5"], ["idle", "#0f9d58"], ["waiting", "#d93025"]];
      Plotly.react("pool-bars", fields.map(([f, color]) => ({
        type: "bar", name: f.replace("_", " "), x: names.map(M.plotText), y: names.map((n) => pools[n][f] ?? 0), marker: { color },
      })), M.themed({ barmode: "group", height: 220, margin: { l: 50, r: 10, t: 10, b: 30 }, legend: { orientation: "h", y: 1.15 },
        yaxis: yTitle("instances") }),
      { displaylogo: false, responsive: true });
      const rows = names.flatMap((n) => {
        const s = pools[n];
        // ray backend: the team budget beside the job's max, waits on it beside the pool's own, one row per node.
        const budget = s.team_budget ? ` (team ${fmt(s.team_budget.in_use)} / ${fmt(s.team_budget.budget)})` : "";
        const waiting = s.budget_waiting ? `${fmt(s.waiting)} + ${fmt(s.budget_waiting)} on budget` : fmt(s.waiting);
        const row = el("tr", {}, el("td", { text: n }), el("td", { text: `${fmt(s.size)} / ${fmt(s.max)}${budget}` }), el("td", { text: fmt(s.in_use) }),
          el("td", { text: fmt(s.idle) }), el("td", { text: waiting }), el("td", { text: fmt(s.created) }),
          el("td", { class: s.failed ? "bad" : "", text: fmt(s.failed) }),
          el("td", { text: `${fmt(s.acquire_p50_ms, 1)} / ${fmt(s.acquire_p99_ms, 1)}` }));
        const nodes = Object.entries(s.nodes || {}).map(([node, c]) => el("tr", { class: "pool-node" },
          el("td", { text: `  node ${node.slice(0, 8)}` }), el("td", { text: `${fmt(c.starting)} starting` }), el("td", { text: fmt(c.in_use) }),
          el("td", { text: fmt(c.idle) }), el("td", { text: "" }), el("td", { text: `${fmt(c.reclaimed)} reclaimed` }),
          el("td", { class: c.failed ? "bad" : "", text: fmt(c.failed) }), el("td", { text: "" })));
        return [row, ...nodes, ...apiRow(s), ...serviceRow(s)];
      });
      document.getElementById("pool-table").replaceChildren(el("table", { class: "table small", id: "pool-stats" },
        el("thead", {}, el("tr", {}, ...["pool", "size/max", "in use", "idle", "waiting", "created", "failed", "acquire p50/p99 ms"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...rows)));
      const timeline = [];
      for (const [name, h] of poolHistory) {
        // The most held during each step (a trainer that reports it), else what was held when sampled: between
        // steps that is often nothing, so the peak is the line that shows the pool's real use.
        const peak = h.peak_in_use && h.peak_in_use.y.some((v) => v !== null && v !== undefined);
        timeline.push(trace(peak ? h.peak_in_use : h.in_use, { name: M.plotText(`${name} ${peak ? "peak in use per step" : "in use"}`), line: { shape: "hv" } }));
        timeline.push(trace(h.waiting, { name: M.plotText(`${name} waiting`), line: { dash: "dot" } }));
      }
      Plotly.react("pool-timeline", timeline, M.themed({ height: 200, margin: { l: 50, r: 10, t: 10, b: 30 }, legend: { orientation: "h", y: -0.3 },
        yaxis: yTitle("instances") }),
        { displaylogo: false, responsive: true });
    }
    const gpus = worker.gpus;
    const items = [
      ["CPU", `${fmt(worker.cpu_percent, 1)} % of ${worker.cpu_count} cores`],
      ["Memory", `${fmt(worker.memory_percent, 1)} % (${fmt(worker.memory_used_mb / 1024, 1)} / ${fmt(worker.memory_total_mb / 1024, 1)} GiB)`],
      ["Process RSS", `${fmt(worker.process_rss_mb, 0)} MiB`],
      ["Host", `${worker.host}:${worker.pid}`],
    ];
    if (Object.keys(engine).length) {
      // The rollout engine's Engine.stats(): how well concurrent rollouts share the model.
      items.push(["Rollout engine", `${fmt(engine.sequences)} sequences · ${fmt(engine.generated_tokens)} tokens` +
        (engine.max_batch === undefined ? "" : ` · max batch ${fmt(engine.max_batch)}`) +
        (engine.tokens_per_second ? ` · ${fmt(engine.tokens_per_second, 1)} tok/s` : "")]);
    }
    const summary = el("dl", { class: "kv" });
    for (const [k, v] of items) summary.append(el("dt", { text: k }), el("dd", { text: v }));
    if (gpus.length) {
      gpus.forEach((g) => summary.append(el("dt", { text: `GPU ${g.index}` }),
        el("dd", { text: `${g.name} · ${fmt(g.util_percent, 0)} % util · ${fmt(g.memory_used_mb / 1024, 1)} / ${fmt(g.memory_total_mb / 1024, 1)} GiB` })));
    } else {
      summary.append(el("dt", { text: "GPU" }), el("dd", { class: "muted", id: "gpu-absent", text: `absent — ${worker.gpu_absent}` }));
    }
    document.getElementById("worker-summary").replaceChildren(summary);
    const traces = [trace(workerHistory.cpu, { name: "CPU %" }), trace(workerHistory.mem, { name: "memory %" })];
    for (const [key, h] of workerHistory.gpus) {
      traces.push(trace(h.util, { name: `GPU ${key} util %` }));
      traces.push(trace(h.mem, { name: `GPU ${key} memory %`, line: { dash: "dot" } }));
    }
    Plotly.react("worker-timeline", traces, M.themed({ height: 200, margin: { l: 50, r: 10, t: 10, b: 30 }, yaxis: yTitle("percent", { range: [0, 100] }),
      legend: { orientation: "h", y: -0.3 } }), { displaylogo: false, responsive: true });
  }

  /* ------------------------------------------------------------------------------------- wiring */
  const fetchRange = M.rangeFetcher(config.series_url);
  const charts = new M.MetricCharts(document.getElementById("charts"), {
    band: true, extras: M.moreMetrics(), user: config.user, fetchRange: (series, keys, range) => fetchRange(keys, range) });
  M.bindChartControls(charts);
  let lastSeq = 0;

  function onEvents(events) {
    for (const event of events) {
      eventCount += 1;
      const data = M.payload(event);
      switch (event.type) {
        case "metrics":
          charts.addLive(config.id, event.seq, event.step ?? event.seq, M.numericMetrics(data), event.time);
          if (typeof data["time/step"] === "number") noteStepTime(event.step, data["time/step"]);
          setStep(event.step);
          if (typeof data["reward_errors/fraction"] === "number") showRewardShare(event.step, data["reward_errors/fraction"]);
          break;
        case "samples": indexSamples(event.step, event.seq); break;
        case "resources": if (event.stub) break; addResources(event); break;
        case "status": setStatus(data.state); appendLog(event); break;
        case "checkpoint": setCheckpoint(data.step); appendLog(event); break;
        case "log": appendLog(event); if (data.level === "warning" && data.traceback) showRewardErrors(event); break;
        default: break;
      }
    }
    lastSeq = events[events.length - 1].seq;
    showCount();
    scheduleRender();
  }

  function showCount() { document.getElementById("event-count").textContent = `${eventCount} events · last #${lastSeq}`; }

  let renderTimer = null;
  function scheduleRender() {
    if (renderTimer !== null) return;
    renderTimer = setTimeout(() => { renderTimer = null; renderRollouts(); renderResources(); }, 250);
  }

  /* A resumed job's charts begin with its ancestors' points: say whose, and up to which step. */
  function showLineage(lineage) {
    const note = document.getElementById("lineage-note");
    if (!lineage.length) return;
    note.hidden = false;
    note.replaceChildren("Continues ", ...lineage.flatMap((a, i) => [i ? ", then " : "",
      el("a", { href: `${config.dashboard_url.replace(/\/\d+\/$/, "")}/${a.id}/`, text: `#${a.id} ${a.name}` }),
      ` up to step ${a.to_step}`]), ": its points come first in the charts.");
  }

  const connection = document.getElementById("connection");
  const state = { socket: null, charts, drawnAt: null, historyEvents: 0, timings: { start: performance.now() },
    caughtUp: false, endDelayMs: 3000 };
  window.agentflyDashboard = state;

  async function start() {
    connection.dataset.state = "loading"; connection.textContent = "loading history";
    const history = await M.getJSON(config.series_url);
    state.timings.fetched = performance.now();
    totalSteps = history.job.total_steps;
    setStatus(history.job.status, history.job.cancel_requested, history.job.phase);
    setStep(history.job.step);
    charts.setStartSteps(config.id, history.starts || []);
    showLineage(history.lineage || []);
    charts.load(config.id, history.metrics, history.times);
    const stepTime = history.metrics["time/step"];
    if (stepTime) stepTime.y.slice(-ETA_WINDOW).forEach((v, i, all) => noteStepTime(stepTime.x[stepTime.x.length - all.length + i], v));
    state.timings.loaded = performance.now();
    charts.flush(); // draw now, not on the next tick: the page is judged by when its charts appear
    state.timings.charts = performance.now();
    loadResources(history.resources, history.latest_resources);
    renderResources();
    for (const event of history.log) appendLog(event);
    for (const [step, seq] of history.samples) indexSamples(step, seq, false);
    if (sampleIndex.length && followBox.checked) showSeq(sampleIndex[sampleIndex.length - 1][1]);
    lastSeq = history.last_seq; eventCount = history.last_seq; showCount();
    state.historyEvents = history.last_seq;
    state.drawnAt = performance.now();
    document.body.dataset.history = "drawn";
    state.socket = new M.EventSocket(config.ws_path, {
      onEvents,
      onHello: (job) => { totalSteps = job.total_steps; setStatus(job.status, job.cancel_requested, job.phase); },
      onState: (s, detail) => {
        if (connection.dataset.state === "ended") return;
        connection.dataset.state = s; connection.textContent = detail || s;
        if (s === "live") { state.caughtUp = true; if (!ACTIVE.has(jobStatus)) ended(); }
      },
    }, history.last_seq);
    state.socket.start();
  }
  start().catch((err) => {
    connection.dataset.state = "refused"; connection.textContent = `could not load the history: ${err.message}`;
  });
})();
