// Ferry's only script: composer keys and its Send/Stop button, pictures attached to the
// composer (picked, pasted, dropped) and the large view of one, copy buttons, editing a sent
// message, the conversation drawer, the theme, keeping the newest message in view; and what
// the Content-Security-Policy keeps out of the HTML (no inline handlers): dismissing a notice, the import picker, the sidebar's refresh while a reply is written; the
// dashboard's Cancel buttons kept across the board's redraws.
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

  // pictures for the next message: the composer's file input holds them (a DataTransfer
  // keeps the picked, pasted and dropped ones together) and they go with the form as
  // multipart files; the previews are data: URLs (what the CSP's img-src allows)
  var picked = null;

  function attachInput() {
    var form = composer();
    return form ? form.querySelector("input[data-attach]") : null;
  }

  function pickedFiles() { return picked ? picked.files : []; }

  function seesImages() {
    var select = document.querySelector("select.model-pick[form=composer]");  // a new chat's
    if (select) {
      var option = select.selectedOptions[0];
      return !!(option && option.dataset.images);
    }
    var form = composer();
    return !!form && form.dataset.seesImages === "1";
  }

  function showAttachments() {
    var form = composer();
    if (!form || !attachInput()) return;
    var tray = form.querySelector(".attach-tray");
    tray.innerHTML = "";
    var files = pickedFiles();
    Array.prototype.forEach.call(files, function (file, i) {
      var box = document.createElement("div");
      box.className = "preview";
      box.title = file.name;
      var img = document.createElement("img");
      img.alt = file.name;
      img.addEventListener("error", function () { img.remove(); });  // not a picture: its name
      var name = document.createElement("span");
      name.className = "name";
      name.textContent = file.name;
      var remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.setAttribute("aria-label", "Remove " + file.name);
      remove.dataset.removeAttachment = String(i);
      box.append(img, name, remove);
      tray.append(box);
      var reader = new FileReader();
      reader.onload = function () { img.src = reader.result; };
      reader.readAsDataURL(file);
    });
    tray.hidden = !files.length;
    form.querySelector(".attach-warn").hidden = !files.length || seesImages();
    form.querySelector("textarea").required = !files.length;  // a picture alone may be sent
  }

  function attach(files) {
    var input = attachInput();
    if (!input || !files.length) return false;
    if (!picked) picked = new DataTransfer();
    Array.prototype.forEach.call(files, function (file) { picked.items.add(file); });
    input.files = picked.files;
    showAttachments();
    return true;
  }

  function detach(index) {
    var kept = new DataTransfer();
    Array.prototype.forEach.call(pickedFiles(), function (file, i) {
      if (i !== index) kept.items.add(file);
    });
    picked = kept;
    attachInput().files = picked.files;
    showAttachments();
  }

  function clearAttachments() {
    picked = null;
    var input = attachInput();
    if (input) input.value = "";
    showAttachments();
  }

  function carriesFiles(e) {
    return e.dataTransfer && Array.prototype.indexOf.call(e.dataTransfer.types, "Files") >= 0;
  }

  function viewImage(src) {
    var box = document.querySelector("dialog.lightbox");
    if (!box) return false;
    box.querySelector("img").src = src;
    box.showModal();
    return true;
  }

  // the conversation's model changed while pictures wait in the composer: saved in the
  // background, so the pictures stay and the warning follows the new model
  function switchModel(select) {
    var form = select.form;
    var headers = { "HX-Request": "true" };
    try { Object.assign(headers, JSON.parse(document.body.getAttribute("hx-headers") || "{}")); }
    catch (err) { /* no CSRF header (local mode) */ }
    fetch(form.action, { method: "POST", headers: headers,
                         body: new URLSearchParams(new FormData(form)) })
      .then(function (response) {
        if (!response.ok) throw new Error(String(response.status));
        var option = select.selectedOptions[0];
        composer().dataset.seesImages = option && option.dataset.images ? "1" : "0";
        composer().querySelector("textarea").placeholder = "Message " + select.value + "…";
        showAttachments();
      })
      .catch(function () { form.submit(); });
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
    var open = document.querySelector("dialog.lightbox[open]");
    if (e.key === "Escape" && open) { open.close(); e.preventDefault(); return; }
    if ((e.key === "Enter" || e.key === " ") && area.matches && area.matches("label.attach")) {
      e.preventDefault();
      attachInput().click();  // the paperclip from the keyboard
      return;
    }
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
      if ((area.value.trim() || pickedFiles().length) &&
          !composer().classList.contains("busy")) area.form.requestSubmit();
    }
  });

  // a reply in progress somewhere: refresh the list so its mark goes when it ends
  setInterval(function () {
    var list = document.getElementById("conversations");
    if (list && window.htmx && list.querySelector(".live-dot")) htmx.trigger(list, "ferry:poll");
  }, 3000);

  document.addEventListener("change", function (e) {
    if (!e.target.matches) return;
    if (e.target.matches("form.model-pick select") && pickedFiles().length) {
      switchModel(e.target);  // keep the attached pictures: no reload
    } else if (e.target.matches("[data-submit-on-change]")) {
      e.target.form.submit();
    }
    if (e.target.matches("input[data-attach]")) attach(Array.prototype.slice.call(e.target.files));
    if (e.target.matches("select.model-pick[form=composer]")) showAttachments();
  });

  document.addEventListener("paste", function (e) {
    var files = e.clipboardData ? Array.prototype.slice.call(e.clipboardData.files) : [];
    var here = e.target === document.body || (e.target.closest && e.target.closest("#composer"));
    if (here && files.length && attach(files)) e.preventDefault();
  });

  // a file dropped anywhere on the chat is attached (never opened in place of the page)
  document.addEventListener("dragover", function (e) {
    if (!attachInput() || !carriesFiles(e)) return;
    e.preventDefault();
    composer().classList.add("dropping");
  });
  document.addEventListener("dragleave", function (e) {
    if (attachInput() && !e.relatedTarget) composer().classList.remove("dropping");
  });
  document.addEventListener("drop", function (e) {
    if (!attachInput() || !carriesFiles(e)) return;
    e.preventDefault();
    composer().classList.remove("dropping");
    attach(Array.prototype.slice.call(e.dataTransfer.files));
  });

  // pictures: the large view, and removing one from the composer
  document.addEventListener("click", function (e) {
    var t = e.target;
    if (!t.closest) return;
    var link = t.closest("a[data-view-image]");
    if (link && viewImage(link.href)) { e.preventDefault(); return; }
    if (t.matches(".attach-tray .preview img")) { viewImage(t.src); return; }
    var remove = t.closest("[data-remove-attachment]");
    if (remove) { detach(Number(remove.dataset.removeAttachment)); return; }
    var box = t.closest("dialog.lightbox");
    if (box) box.close();  // a click on the picture, the backdrop or ×
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
      clearAttachments();
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

  // Show earlier: the page grows above the reader; what they read stays where it was
  var fromBottom = null;
  document.addEventListener("htmx:beforeSwap", function (e) {
    var el = messages();
    if (el && e.detail.target && e.detail.target.id === "earlier") {
      fromBottom = el.scrollHeight - el.scrollTop;
    }
  });
  document.addEventListener("htmx:afterSwap", function () {
    var el = messages();
    if (el && fromBottom !== null) {
      el.scrollTo({ top: el.scrollHeight - fromBottom, behavior: "instant" });
      fromBottom = null;
    }
  });

  // The dashboard's board is redrawn whole several times a second while requests run. Its
  // Cancel buttons are kept across redraws (the same elements, moved into the new board):
  // a press, a hover or the keyboard's focus on one survives an update, so no click is lost
  // between the press and the release.
  document.addEventListener("htmx:sseBeforeMessage", function (e) {
    var board = e.target;
    if (board.id !== "board") return;
    e.preventDefault();
    var focused = document.activeElement;  // a kept button loses the focus as it moves
    var next = document.createElement("template");
    next.innerHTML = e.detail.data;
    next.content.querySelectorAll("button[data-cancel]").forEach(function (fresh) {
      var kept = board.querySelector('button[data-cancel="' + CSS.escape(fresh.dataset.cancel) + '"]');
      if (kept && kept.getAttribute("hx-post") === fresh.getAttribute("hx-post") &&
          kept.getAttribute("hx-confirm") === fresh.getAttribute("hx-confirm")) {
        fresh.replaceWith(kept);
      }
    });
    board.replaceChildren(next.content);
    htmx.process(board);
    if (focused && focused !== document.activeElement && board.contains(focused)) {
      focused.focus({ preventScroll: true });
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
