// The desktop's live view: noVNC (vendored by `make setup`) over the console's WebSocket bridge.
// View-only unless control is asked for: the daemon then bridges to the VNC server that takes input
// (the view-only one drops every key and pointer event whatever this page does).
import RFB from "/ui/static/vendor/novnc/core/rfb.js";

const CSRF = document.querySelector('meta[name="csrf"]').content;
const screen = document.getElementById("screen");
const state = document.getElementById("desktop-state");
const button = document.getElementById("desktop-control");
let rfb = null;

function say(text, name) {
  state.textContent = text;
  state.dataset.state = name;
}

function connect(control) {
  if (rfb) {
    rfb.removeEventListener("disconnect", onDisconnect);
    rfb.disconnect();
  }
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = new URLSearchParams({csrf: CSRF, control: control ? "1" : "0"});
  const url = `${scheme}://${location.host}/ui/sandboxes/${encodeURIComponent(screen.dataset.id)}/desktop/vnc?${query}`;
  say("connecting (a suspended sandbox resumes first)", "connecting");
  rfb = new RFB(screen, url, {shared: true});
  rfb.viewOnly = !control;
  rfb.scaleViewport = true;
  rfb.addEventListener("connect", () => say(control ? "in control: your mouse and keys reach the desktop" :
                                            "watching (view only)", control ? "control" : "view"));
  rfb.addEventListener("disconnect", onDisconnect);
  button.dataset.control = control ? "1" : "0";
  button.textContent = control ? "Give back control (watch only)" : "Take control";
}

function onDisconnect(event) {
  say(event.detail.clean ? "disconnected" : "the connection was lost: reload the page to watch again", "disconnected");
}

button.addEventListener("click", () => connect(button.dataset.control !== "1"));
connect(false);
