// The dashboard's own script, served from the binary (the Content-Security-Policy allows no
// inline script). It only adds "select all" to the dead-letter list; every action is a plain
// form POST that works without it.
"use strict";
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box || box.id !== "select-all") { return; }
  var boxes = document.querySelectorAll("input[type=checkbox][name=id]");
  for (var i = 0; i < boxes.length; i++) { boxes[i].checked = box.checked; }
});
