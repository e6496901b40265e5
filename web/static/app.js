// Ferry's only script: composer keys and its Send/Stop button, copy buttons, editing a sent
// message, the conversation drawer, the theme, keeping the newest message in view; and what
// the Content-Security-Policy keeps out of the HTML (no inline handlers): dismissing a notice, the import picker, the sidebar's refresh while a reply is written.
(function () {
  "use strict";

  function messages() { return document.getElementById("messages"); }
  function composer() { return document.getElementById("composer"); }
  function streamingStop() {
    return document.querySelector("#messages article.msg.streaming button.stop");
  }

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

  // while a reply streams the composer's button is Stop (a second send would be refused)
  function updateComposer() {
    var form = composer();
    if (!form) return;
    var busy = !!streamingStop();
    form.classList.toggle("busy", busy);
    var button = form.querySelector("button.send");
    button.setAttribute("aria-label", busy ? "Stop" : "Send");
    button.title = busy ? "Stop the reply (Esc)" : "Send (Enter)";
    var mark = document.querySelector("#conversations .conv.active .live-dot");
    if (mark && !busy) mark.remove();
  }

  function stopReply() {
    var stop = streamingStop();
    if (stop) stop.click();
    return !!stop;
  }

  function copyText(text, button) {
    function done() {
      var was = button.textContent;
      button.textContent = "Copied";
      button.classList.add("copied");
      setTimeout(function () { button.textContent = was; button.classList.remove("copied"); }, 1200);
    }
    // navigator.clipboard needs a secure context; a LAN address over http is not one
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { legacyCopy(text); done(); });
    } else {
      legacyCopy(text);
      done();
    }
  }

  function legacyCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing more to try */ }
    area.remove();
  }

  function setDrawer(open) {
    document.body.classList.toggle("drawer-open", open);
    var toggle = document.querySelector("[data-drawer-toggle]");
    if (toggle) toggle.setAttribute("aria-expanded", open ? "true" : "false");
  }

  function toggleTheme() {
    var root = document.documentElement;
    var dark = root.dataset.theme ? root.dataset.theme === "dark" :
      window.matchMedia("(prefers-color-scheme: dark)").matches;
    root.dataset.theme = dark ? "light" : "dark";
    try { localStorage.setItem("ferry-theme", root.dataset.theme); } catch (e) { /* private */ }
  }

  document.addEventListener("keydown", function (e) {
    var area = e.target;
    if (e.key === "Escape") {
      if (document.body.classList.contains("drawer-open")) { setDrawer(false); return; }
      if (stopReply()) { e.preventDefault(); return; }
    }
    if ((e.ctrlKey || e.metaKey) && e.shiftKey && (e.key === "O" || e.key === "o")) {
      e.preventDefault();
      window.location.href = "/";
      return;
    }
    if (area.matches && area.matches("#composer textarea") && e.key === "Enter" &&
        !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (area.value.trim() && !composer().classList.contains("busy")) area.form.requestSubmit();
    }
  });

  // a reply in progress somewhere: refresh the list so its mark goes when it ends
  setInterval(function () {
    var list = document.getElementById("conversations");
    if (list && window.htmx && list.querySelector(".live-dot")) htmx.trigger(list, "ferry:poll");
  }, 3000);

  document.addEventListener("change", function (e) {
    if (e.target.matches && e.target.matches("[data-submit-on-change]")) e.target.form.submit();
  });

  document.addEventListener("click", function (e) {
    var notice = e.target.closest ? e.target.closest(".notice[data-dismiss]") : null;
    if (notice) { notice.remove(); return; }
    var t = e.target.closest ? e.target.closest("button, [data-drawer-close]") : null;
    if (!t) return;
    var article = t.closest("article.msg");
    if (t.matches("[data-copy]") && article) {
      copyText(article.querySelector("textarea.raw").value, t);
    } else if (t.matches(".copy-code")) {
      copyText(t.closest(".code").querySelector("pre").innerText, t);
    } else if (t.matches("[data-edit]") && article) {
      article.classList.add("editing");
      var form = article.querySelector(".edit-form");
      form.hidden = false;
      var area = form.querySelector("textarea");
      area.focus();
      grow(area);
    } else if (t.matches("[data-edit-cancel]") && article) {
      article.classList.remove("editing");
      article.querySelector(".edit-form").hidden = true;
    } else if (t.matches("[data-drawer-toggle]")) {
      setDrawer(!document.body.classList.contains("drawer-open"));
    } else if (t.matches("[data-drawer-close]")) {
      setDrawer(false);
    } else if (t.matches("[data-theme-toggle]")) {
      toggleTheme();
    }
  });

  document.addEventListener("input", function (e) {
    if (e.target.matches && e.target.matches("#composer textarea, .edit-form textarea")) {
      grow(e.target);
    }
  });

  // Send while a reply streams means Stop
  document.addEventListener("htmx:beforeRequest", function (e) {
    var form = composer();
    if (form && e.detail.elt === form && form.classList.contains("busy")) {
      e.preventDefault();
      stopReply();
    }
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (form.id === "composer" && e.detail.successful) {
      form.reset();
      form.querySelector("textarea").textContent = "";
      grow(form.querySelector("textarea"));
      var empty = document.querySelector("#messages .empty");
      if (empty) empty.remove();
      scrollDown(true);
    }
    if (e.detail.successful) {
      var notice = document.getElementById("notice");
      if (notice && e.detail.xhr.status < 400 && !notice.querySelector(".notice.ok")) {
        notice.innerHTML = "";
      }
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

  document.addEventListener("DOMContentLoaded", function () {
    scrollDown(true);
    var el = messages();
    if (el) new MutationObserver(updateComposer).observe(el, {
      childList: true, subtree: true, attributes: true, attributeFilter: ["class"] });
    updateComposer();
  });
})();
