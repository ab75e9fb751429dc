// The reading copy's search and theme (mambalearn.classroom.site). Offline: the index is
// search-index.js beside the pages (window.mambalearnIndex: one entry per section, written
// when the site is built), loaded with a <script> tag, so it works from file:// too.
(function () {
  "use strict";
  // follow the system's light or dark theme (the CSS variables switch by themselves; this tells
  // JupyterLab's rules for figures that need a light background)
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const theme = () => { document.body.dataset.jpThemeLight = dark.matches ? "false" : "true"; };

  const words = (text) => text.toLowerCase().split(/[^\p{L}\p{N}_]+/u).filter(Boolean);

  // every query word must start a word of the section's title or text; title hits rank first
  function search(query) {
    const want = words(query);
    if (!want.length) return [];
    const hits = [];
    for (const entry of window.mambalearnIndex || []) {
      const title = words(entry.title), text = words(entry.text);
      let score = 0;
      for (const w of want) {
        if (title.some((t) => t.startsWith(w))) score += 3;
        else if (text.some((t) => t.startsWith(w))) score += 1;
        else { score = 0; break; }
      }
      if (score) hits.push([score, entry]);
    }
    return hits.sort((a, b) => b[0] - a[0]).slice(0, 20).map((h) => h[1]);
  }

  function snippet(text, query) {
    const at = Math.max(0, text.toLowerCase().indexOf(words(query)[0] || ""));
    const start = Math.max(0, at - 40);
    return (start ? "…" : "") + text.slice(start, start + 140) + (text.length > start + 140 ? "…" : "");
  }

  function show(box, list) {
    const q = box.value.trim();
    list.replaceChildren(...search(q).map((e) => {
      const li = document.createElement("li"), a = document.createElement("a");
      const small = document.createElement("small");
      a.href = e.page + (e.id ? "#" + encodeURIComponent(e.id) : "");
      a.textContent = e.title;
      small.textContent = e.chapter + " · " + snippet(e.text, q);
      li.append(a, small);
      return li;
    }));
    if (q && !list.children.length) list.textContent = "nothing found";
  }

  document.addEventListener("DOMContentLoaded", () => {
    theme();
    dark.addEventListener("change", theme);
    // on a narrow screen the chapter list starts folded, above the text
    const side = document.querySelector("nav.ml-side details");
    if (side && window.matchMedia("(max-width: 70rem)").matches) side.open = false;
    const box = document.querySelector(".ml-search input");
    const list = document.querySelector(".ml-search ol");
    if (box && list) box.addEventListener("input", () => show(box, list));
  });
  window.mambalearnSite = {search};  // for the tests
})();
