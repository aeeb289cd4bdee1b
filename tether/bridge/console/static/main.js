// Entry point: the API key form, the tabs, and each view's start.

import { setKey, token } from "./api.js";
import { initRace, loadWorkloads } from "./race.js";
import { startServerView, stopServerView } from "./server.js";
import { initSession } from "./session.js";

const $ = (id) => document.getElementById(id);

function show(view) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === view);
  for (const sec of document.querySelectorAll(".view")) sec.classList.toggle("active", sec.id === `view-${view}`);
  if (view === "server") startServerView();
  else stopServerView();
}

// Check the key with one token exchange: says whether it works and whether it is an admin key.
async function applyKey() {
  setKey($("api-key").value);
  const s = $("key-status");
  try {
    const minted = await token();
    s.textContent = `key accepted${minted.admin ? " (admin)" : ""}; tokens live ${minted.expires_in} s`;
    s.className = "status ok";
    $("server-tab").disabled = !minted.admin;
    await loadWorkloads();
  } catch (err) {
    const needed = err.status === 401 && !$("api-key").value.trim();
    s.textContent = needed ? "this server needs an API key" : `key refused: ${err.message}`;
    s.className = "status bad";
  }
}

for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.view));
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  applyKey();
});
initSession();
initRace();
applyKey(); // an open server needs no key: this shows at once whether one is needed
