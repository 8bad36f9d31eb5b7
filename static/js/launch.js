// The launch form shows a field only where it applies: the model directory for a local model, the JSONL files
// for a JSONL task, the problem count for a generated task, the warm start's fields for sft and sft_then_rl,
// the RL fields unless the job is a warm start alone, max staleness for async rollouts, the judge's directory,
// server and rubric for the place its judge runs. A hidden field keeps
// its value and is still posted (the server ignores what does not apply).
(function () {
  "use strict";
  const form = document.querySelector("form.launch");
  if (!form) return;
  const value = (name) => {
    const field = form.elements[name];
    return field ? field.value : "";
  };
  // max_new_tokens is not among them: the held-out evaluation of every kind generates with it.
  const RL = ["algorithm", "steps", "prompts_per_step", "group_size", "learning_rate", "temperature",
    "rollout_mode", "max_staleness", "eval_every", "save_every"];
  const rules = {
    model_path: () => value("model_source") === "path",
    task_path: () => value("task") === "jsonl",
    eval_path: () => value("task") === "jsonl",
    task_size: () => value("task") !== "jsonl",
    max_staleness: () => value("kind") !== "sft" && value("rollout_mode") === "async",
    judge_model_path: () => value("judge_source") === "path",
    judge_server: () => value("judge_source") === "server",
    judge_rubric: () => value("judge_source") !== "",
  };
  for (const name of RL) if (!rules[name]) rules[name] = () => value("kind") !== "sft";
  function apply() {
    for (const [name, shown] of Object.entries(rules)) {
      const box = form.querySelector(`.field[data-field="${name}"]`);
      // A field with an error stays in view, so the user can see what to fix.
      if (box) box.hidden = !shown() && !box.classList.contains("has-error");
    }
    const warm = document.getElementById("warm-start-fields");
    if (warm) warm.hidden = !(value("kind") === "sft" || value("kind") === "sft_then_rl") && !warm.querySelector(".has-error");
  }
  form.addEventListener("change", apply);
  apply();
})();
