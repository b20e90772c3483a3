// The dashboard's own script, served from the binary (the Content-Security-Policy allows no
// inline script). It adds "select all" to the dead-letter list and a dispatch's live output;
// every action is a plain form POST that works without it.
"use strict";
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box || box.id !== "select-all") { return; }
  var boxes = document.querySelectorAll("input[type=checkbox][name=id]");
  for (var i = 0; i < boxes.length; i++) { boxes[i].checked = box.checked; }
});

// A dispatch page's live output: the dispatch's stream (server-sent events from our own
// origin, with the session's cookie), each delta's text inserted as text, never as markup.
(function () {
  var section = document.getElementById("output");
  if (!section || !window.EventSource) { return; }
  var text = document.getElementById("output-text");
  var state = document.getElementById("output-state");
  var source = new EventSource(section.getAttribute("data-stream"));
  function data(event) {
    try { return JSON.parse(event.data); } catch (e) { return {}; }
  }
  source.addEventListener("delta", function (event) {
    var d = data(event);
    var piece = typeof d.text === "string" ? d.text : "[" + String(d.data || "").length + " base64 characters of bytes that are not text]";
    text.appendChild(document.createTextNode(piece));
    state.textContent = "Streaming (delta " + event.lastEventId + ").";
  });
  source.addEventListener("reset", function () {
    text.textContent = "";
    state.textContent = "The run started again; what it streamed before is gone.";
  });
  source.addEventListener("status", function (event) {
    var d = data(event);
    if (!text.textContent) { state.textContent = "Status: " + String(d.status) + "."; }
  });
  source.addEventListener("result", function (event) {
    var d = data(event);
    state.textContent = "Finished: " + String(d.status) + ".";
    source.close();
  });
  // A stream the server ended otherwise (`dropped`, its time limit) is resumed by the
  // browser with Last-Event-ID.
})();
