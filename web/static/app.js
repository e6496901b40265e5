// Ferry's only script: composer keys, keeping the newest message in view, dismissing notices.
(function () {
  "use strict";

  function messages() { return document.getElementById("messages"); }

  function nearBottom(el) {
    return el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  }

  function scrollDown(force) {
    var el = messages();
    if (el && (force || nearBottom(el))) el.scrollTop = el.scrollHeight;
  }

  function grow(area) {
    area.style.height = "auto";
    area.style.height = Math.min(area.scrollHeight, 240) + "px";
  }

  document.addEventListener("keydown", function (e) {
    var area = e.target;
    if (area.matches && area.matches("#composer textarea") && e.key === "Enter" &&
        !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (area.value.trim()) area.form.requestSubmit();
    }
  });

  document.addEventListener("input", function (e) {
    if (e.target.matches && e.target.matches("#composer textarea")) grow(e.target);
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (form.id === "composer" && e.detail.successful) {
      form.reset();
      grow(form.querySelector("textarea"));
      var empty = document.querySelector("#messages .empty");
      if (empty) empty.remove();
      scrollDown(true);
    }
    if (e.detail.successful) {
      var notice = document.getElementById("notice");
      if (notice && e.detail.xhr.status < 400) notice.innerHTML = "";
    }
  });

  // streamed tokens and finished replies: follow them while the reader is at the bottom
  document.addEventListener("htmx:sseBeforeMessage", function () {
    var el = messages();
    window.__ferryFollow = el ? nearBottom(el) : false;
  });
  document.addEventListener("htmx:sseMessage", function () {
    if (window.__ferryFollow) scrollDown(true);
  });

  document.addEventListener("DOMContentLoaded", function () { scrollDown(true); });
})();
