// The console's only script, and an optional one: every page reads and every form submits without
// it. It adds (1) live updates over server-sent events (the server sends rendered HTML per region),
// (2) the New Training form's sliders, buttons, range hints and a live Training Summary (a dry
// run on the server), (3) Merge Model's progress bar.
"use strict";

// ------------------------------------------------------------------ live regions
function startLive() {
  const main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource) return;
  const source = new EventSource(main.dataset.live);
  document.body.dataset.live = "open";
  source.addEventListener("update", (event) => {
    const regions = JSON.parse(event.data);
    for (const [id, html] of Object.entries(regions)) {
      const element = document.getElementById(id);
      if (element) element.outerHTML = html;
    }
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  });
  source.addEventListener("done", () => {
    source.close();  // an EventSource reconnects by itself: the run has ended, so stop here
    document.body.dataset.live = "done";
    document.querySelectorAll(".live-dot").forEach((dot) => dot.remove());
  });
}

// ------------------------------------------------------------------ the New Training form
function fieldSlot(input) {
  const field = input.closest("[data-field]");
  return field ? field.querySelector("[data-msg-for]") : null;
}

function checkRange(input) {
  // A hint, not a gate: the server validates every submit and its error lands in the same slot.
  const slot = fieldSlot(input);
  if (!slot || input.dataset.low === undefined) return;
  const text = input.value.trim().replace(/%$/, "");
  const value = Number(text);
  const low = Number(input.dataset.low), high = Number(input.dataset.high);
  const bad = text !== "" && (!Number.isFinite(value) || value < low - 1e-12 || value > high + 1e-12);
  input.classList.toggle("out-of-range", bad);
  if (bad) {
    slot.className = "msg client";
    slot.textContent = `${text} is out of range; allowed: ${input.dataset.allowed || low + "-" + high}`;
  } else if (slot.classList.contains("client") || slot.classList.contains("error")) {
    slot.className = "msg";
    slot.textContent = "";
    input.removeAttribute("aria-invalid");
  }
}

function activeOptions(form) {
  const active = new Set();
  // the Training Method: each choice names the card it shows (forms.METHOD_CHOICES); Reinforcement
  // (RLVR)'s are the Reward and GRPO cards, with their conditional fields
  const method = form.querySelector('input[name="method"]:checked');
  const card = method ? method.dataset.card : "rlvr";
  if (card && card !== "rlvr") return new Set([card]);  // none of RLVR's conditional fields applies
  active.add("rlvr");
  // each Reward choice says whether it generates its prompts and whether it reads a dataset
  const reward = form.querySelector('input[name="reward.key"]:checked')
    || form.querySelector('input[name="reward.key"]');
  if (reward && reward.dataset.generated) active.add("generated");
  if (reward && reward.dataset.dataset) active.add("dataset");
  const backend = form.elements["advanced.generation_backend"];
  if (backend && backend.value === "3") active.add("colocate");
  if (!backend || backend.value === "" || backend.value === "1") active.add("vllm");
  const environment = form.elements["environment.key"];
  if (environment && environment.value.trim() !== "") active.add("environment");
  const bench = form.elements["loop.benchmark"];
  const option = bench && bench.selectedOptions[0];
  if (option && option.dataset.needsDataset) active.add("dataset_benchmark");
  return active;
}

function showConditional(form) {
  const active = activeOptions(form);
  form.querySelectorAll("[data-only]").forEach((field) => {
    field.hidden = !active.has(field.dataset.only);
  });
}

function resetScoreColumn(form) {
  // The spec: Score Column resets to the benchmark's default when the benchmark changes.
  const bench = form.elements["loop.benchmark"], column = form.elements["loop.score_column"];
  const option = bench && bench.selectedOptions[0];
  if (!option || !column) return;
  column.replaceChildren(...option.dataset.columns.split(",").map((name) => new Option(name, name)));
  column.value = option.dataset.default;
}

function markChips(form) {
  form.querySelectorAll(".chip[data-set]").forEach((chip) => {
    const target = document.getElementById(chip.dataset.set);
    const same = target && Number(target.value) === Number(chip.dataset.value) && target.value.trim() !== "";
    chip.setAttribute("aria-pressed", same ? "true" : "false");
  });
}

let previewTimer = null;
let previewSeq = 0;
function refreshSummary(form) {
  clearTimeout(previewTimer);
  previewTimer = setTimeout(async () => {
    const seq = ++previewSeq;
    const response = await fetch("/train/summary", { method: "POST", body: new FormData(form) });
    if (!response.ok || seq !== previewSeq) return;
    const answer = await response.json();
    const sidebar = document.getElementById("train-summary");
    if (sidebar) sidebar.outerHTML = answer.sidebar;
    form.querySelectorAll("[data-msg-for]").forEach((slot) => {
      if (slot.classList.contains("client")) return;  // the range hint stands until fixed
      const message = answer.messages[slot.dataset.msgFor];
      slot.className = message ? `msg ${message.kind}` : "msg";
      slot.textContent = message ? message.text : "";
    });
    form.dataset.previews = String(Number(form.dataset.previews || 0) + 1);
  }, 250);
}

function enhanceForm(form) {
  form.querySelectorAll("[data-js]").forEach((element) => { element.hidden = false; });
  form.querySelectorAll("input.slider").forEach((slider) => {
    const number = document.getElementById(slider.dataset.for);
    slider.hidden = false;
    if (number.value !== "") slider.value = number.value;
    slider.addEventListener("input", () => {
      number.value = slider.value;
      number.dispatchEvent(new Event("input", { bubbles: true }));
    });
    slider.addEventListener("change", () => number.dispatchEvent(new Event("change", { bubbles: true })));
    number.addEventListener("input", () => { if (number.value !== "") slider.value = number.value; });
  });
  form.querySelectorAll(".chip[data-set]").forEach((chip) => {
    chip.addEventListener("click", () => {
      const target = document.getElementById(chip.dataset.set);
      target.value = chip.dataset.value;
      target.dispatchEvent(new Event("input", { bubbles: true }));
      target.dispatchEvent(new Event("change", { bubbles: true }));
    });
  });
  form.addEventListener("input", (event) => {
    if (event.target.matches("input[data-low]")) checkRange(event.target);
    markChips(form);
  });
  form.addEventListener("change", (event) => {
    if (event.target.name === "loop.benchmark") resetScoreColumn(form);
    showConditional(form);
    refreshSummary(form);
  });
  showConditional(form);
  markChips(form);
  const summary = document.getElementById("error-summary");
  if (summary) summary.focus();
}

// ------------------------------------------------------------------ Merge Model
async function merge(form) {
  const box = form.parentElement.querySelector(".merge-progress");
  const bar = box.querySelector("progress"), status = box.querySelector("[role=status]");
  const button = form.querySelector("button");
  const dtype = (form.querySelector("select[name=dtype]") || {}).value || "auto";  // as sent, whatever changes after
  box.hidden = false;
  button.disabled = true;
  status.textContent = "starting…";
  const response = await fetch(form.action, { method: "POST", body: new FormData(form),
                                              headers: { Accept: "text/event-stream" } });
  if (!response.ok) {
    status.textContent = `merge refused (${response.status}): ${await response.text()}`;
    button.disabled = false;
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const kind = (block.match(/^event: ?(.*)$/m) || [])[1] || "message";
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.replace(/^data: ?/, "")).join("\n");
      if (kind === "progress") {
        const p = JSON.parse(data);
        bar.value = p.fraction;
        status.textContent = p.done ? `merged: ${p.path}${p.size ? " (" + p.size + ")" : ""}` : `${p.stage || "merging"} ${Math.round(p.fraction * 100)}%`;
        if (p.done) {
          const link = document.createElement("a");
          link.href = new URL(form.action).pathname.replace(/\/merge$/, "/merged.zip") + "?dtype=" + encodeURIComponent(dtype);
          link.className = "button";
          link.textContent = "Download merged model";
          link.setAttribute("download", "");
          box.append(" ", link);
          box.dataset.done = "true";
        }
      } else if (kind === "failed") {
        status.textContent = `merge failed: ${data}`;
        button.disabled = false;
      }
    }
  }
}

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.matches("form[data-merge]") && window.fetch && window.ReadableStream) {
    event.preventDefault();
    merge(form).catch((error) => {
      form.parentElement.querySelector("[role=status]").textContent = `merge failed: ${error}`;
    });
  }
});

document.addEventListener("DOMContentLoaded", () => {
  startLive();
  const form = document.getElementById("train-form");
  if (form) enhanceForm(form);
});
