// The console's only script: live updates from the daemon's feed, actions, the terminal, uploads.
// Everything that came from a sandbox is put in the page as text (textContent), never as markup.
"use strict";

const CSRF = document.querySelector('meta[name="csrf"]')?.content || "";

function flash(text, isError) {
  const el = document.getElementById("flash");
  if (!el) return;
  el.textContent = text;
  el.className = isError ? "error" : "";
}

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: {"x-stasis-csrf": CSRF, "content-type": "application/json"},
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

async function act(id, action) {
  if (!confirm(`${action} ${id}?`)) return;
  flash(`${action} ${id}...`);
  try {
    const answer = await post(`/ui/sandboxes/${encodeURIComponent(id)}/${action}`, {type: "memory"});
    flash(answer.checkpoint ? `checkpoint ${answer.checkpoint} made` :
          answer.sandboxes ? `forked: ${answer.sandboxes.join(", ")}` : `${action}: done`);
  } catch (error) {
    flash(`${action} failed: ${error.message}`, true);
  }
}

function cell(row, text) {
  const td = row.insertCell();
  td.textContent = text;
  return td;
}

function renderRow(row, s) {
  row.replaceChildren();
  row.dataset.id = s.id;
  const link = document.createElement("a");
  link.href = `/ui/sandboxes/${encodeURIComponent(s.id)}`;
  link.textContent = s.name;
  row.insertCell().append(link);
  const status = cell(row, s.status);
  status.className = "status";
  status.dataset.status = s.status;
  cell(row, s.backend);
  cell(row, s.image);
  cell(row, `${s.cpus} / ${s.memory_mb} MiB`);
  cell(row, s.cpu_percent === null ? "-" : `${s.cpu_percent}%`);
  cell(row, s.memory_used_mib === null ? "-" : `${s.memory_used_mib} MiB`);
  cell(row, `${s.idle_secs}s` + (s.idle_action_in !== null ? ` (${s.idle_action} in ${s.idle_action_in}s)` : ""));
  cell(row, s.network);
  cell(row, s.ports.length ? s.ports.join(", ") : "-");
  const actions = row.insertCell();
  for (const action of ["suspend", "resume", "checkpoint", "fork", "remove"]) {
    const button = document.createElement("button");
    button.textContent = action;
    button.dataset.action = action;
    button.onclick = () => act(s.id, action);
    actions.append(button);
  }
}

function followSandboxes() {
  const body = document.querySelector("#sandboxes tbody");
  const empty = document.querySelector(".empty");
  const events = new EventSource("/ui/events");
  events.onmessage = (message) => {
    const sandboxes = JSON.parse(message.data);
    body.replaceChildren();
    for (const s of sandboxes) renderRow(body.insertRow(), s);
    if (empty) empty.hidden = sandboxes.length > 0;
  };
}

function followSandbox(id) {
  const status = document.getElementById("status");
  const events = new EventSource("/ui/events");
  events.onmessage = (message) => {
    const s = JSON.parse(message.data).find((x) => x.id === id);
    status.textContent = s ? s.status : "removed";
    status.dataset.status = status.textContent;
  };
  for (const button of document.querySelectorAll(".actions button")) {
    button.onclick = () => act(id, button.dataset.action);
  }
  const terminal = document.getElementById("open-terminal");
  terminal.onclick = () => openTerminal(id);
  terminal.disabled = false;  // disabled in the page until now: a click before the scripts ran did nothing
  const code = document.getElementById("code");
  code.onsubmit = (event) => { event.preventDefault(); runCode(id, code.elements.code.value); };
  const upload = document.getElementById("upload");
  upload.onsubmit = async (event) => {
    event.preventDefault();
    const form = new FormData(upload);
    const response = await fetch(
      `/ui/sandboxes/${encodeURIComponent(id)}/upload?dir=${encodeURIComponent(upload.dataset.dir)}`,
      {method: "POST", headers: {"x-stasis-csrf": CSRF}, body: form});
    const answer = await response.json().catch(() => ({}));
    if (response.ok) location.reload(); else flash(`upload failed: ${answer.error}`, true);
  };
}

function openTerminal(id) {
  const term = new Terminal({convertEol: false, fontSize: 14});
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  const box = document.getElementById("terminal");
  box.replaceChildren();
  term.open(box);
  fit.fit();
  window.stasisTerminal = term;  // the browser tests read its screen
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(
    `${scheme}://${location.host}/ui/sandboxes/${encodeURIComponent(id)}/pty?cols=${term.cols}&rows=${term.rows}&csrf=${encodeURIComponent(CSRF)}`);
  socket.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  socket.onmessage = (message) => {
    if (typeof message.data !== "string") term.write(new Uint8Array(message.data));
  };
  socket.onclose = (event) => term.write(`\r\n[terminal closed${event.reason ? ": " + event.reason : ""}]\r\n`);
  term.onData((data) => socket.readyState === WebSocket.OPEN && socket.send(encoder.encode(data)));
  term.onResize(({cols, rows}) => socket.readyState === WebSocket.OPEN &&
    socket.send(JSON.stringify({type: "resize", cols, rows})));
  window.addEventListener("resize", () => fit.fit());
  term.focus();
}

function wireTree() {
  for (const button of document.querySelectorAll("button[data-restore]")) {
    button.onclick = async () => {
      if (!confirm(`restore checkpoint ${button.dataset.restore} into a new sandbox?`)) return;
      try {
        const answer = await post(`/ui/checkpoints/${encodeURIComponent(button.dataset.restore)}/restore`);
        location.href = `/ui/sandboxes/${encodeURIComponent(answer.sandbox)}`;
      } catch (error) {
        flash(`restore failed: ${error.message}`, true);
      }
    };
  }
  for (const button of document.querySelectorAll("button[data-action]")) {
    button.onclick = async () => { await act(button.dataset.target, button.dataset.action); location.reload(); };
  }
}


// One run_code execution, drawn as its lines arrive. Text goes in as text; a kernel's HTML (a DataFrame) only
// inside a frame that may run nothing and reach nothing (sandbox="" : no scripts, an opaque origin).
async function runCode(id, source) {
  const output = document.getElementById("code-output");
  output.replaceChildren();
  const response = await fetch(`/ui/sandboxes/${encodeURIComponent(id)}/code`, {
    method: "POST", headers: {"x-stasis-csrf": CSRF, "content-type": "application/json"},
    body: JSON.stringify({code: source}),
  });
  if (!response.ok) {
    const answer = await response.json().catch(() => ({}));
    flash(`run failed: ${answer.error || response.statusText}`, true);
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    pending += decoder.decode(value, {stream: true});
    const lines = pending.split("\n");
    pending = lines.pop();
    for (const line of lines) if (line.trim()) output.append(drawLine(JSON.parse(line)));
  }
}

function drawLine(line) {
  const pre = (text, kind) => { const el = document.createElement("pre"); el.className = kind; el.textContent = text; return el; };
  if (line.type === "stdout" || line.type === "stderr") return pre(line.text, line.type);
  if (line.type === "error") return pre(line.traceback || `${line.name}: ${line.value}`, "error");
  if (line.type !== "result") return document.createTextNode("");
  for (const kind of ["png", "jpeg"]) {
    if (line[kind]) {
      const img = document.createElement("img");
      img.src = `data:image/${kind};base64,${line[kind]}`;
      img.className = "result";
      return img;
    }
  }
  if (line.html) {
    const frame = document.createElement("iframe");
    frame.setAttribute("sandbox", "");
    frame.srcdoc = line.html;
    frame.className = "result";
    return frame;
  }
  return pre(line.text ?? "", "result");
}
