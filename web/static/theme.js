// The reader's theme before the first paint (app.js keeps it in localStorage). A file, not an
// inline script: the Content-Security-Policy runs only Ferry's own scripts.
try {
  var t = localStorage.getItem("ferry-theme") ||
    (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "");
  if (t) document.documentElement.dataset.theme = t;
} catch (e) { /* storage refused: the system's theme */ }
