// fencegate console: refresh the shown screen in place every few seconds, while
// the tab is visible. The server renders the HTML; this only swaps it in.
// Times are written as everywhere else (leases/formats.py): UTC, RFC 3339.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var status = document.getElementById("live");
  if (!main || !status) { return; }
  var EVERY_MS = 2000;
  var last = main.innerHTML;
  var busy = false;

  function url() {
    var q = new URLSearchParams(location.search);
    q.delete("notice");
    q.set("part", "1");
    return location.pathname + "?" + q.toString();
  }

  function say(text, stale) {
    status.textContent = text;
    status.classList.toggle("stale", !!stale);
  }

  async function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    try {
      var r = await fetch(url(), { credentials: "same-origin", cache: "no-store" });
      if (r.redirected) { location.reload(); return; }  // the session ended: log in
      var html = await r.text();
      if (html !== last && !main.contains(document.activeElement)) {
        main.innerHTML = html;
        last = html;
      }
      say(r.ok ? "live, updated " + new Date().toISOString()
               : "database unreachable", !r.ok);
    } catch (e) {
      say("gateway unreachable", true);
    } finally {
      busy = false;
    }
  }

  setInterval(refresh, EVERY_MS);
  document.addEventListener("visibilitychange", refresh);
})();
