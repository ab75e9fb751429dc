// The reading copy's search, theme and reading aids (course.classroom.site). Offline: the
// index is search-index.js beside the pages (window.mambalearnIndex: one entry per section of
// prose, per code cell and per API name, written when the site is built), loaded with a
// <script> tag, so it works from file:// too.
(function () {
  "use strict";
  // follow the system's light or dark theme (the CSS variables switch by themselves; this tells
  // JupyterLab's rules for figures that need a light background)
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const theme = () => { document.body.dataset.jpThemeLight = dark.matches ? "false" : "true"; };

  const words = (text) => text.toLowerCase().split(/[^\p{L}\p{N}_]+/u).filter(Boolean);
  const KIND = {prose: 0, api: 1, code: 2};  // equal scores: prose first, then API, then code

  // every query word must start a word of the entry's title or text (or, for code and API
  // names, appear inside an identifier: "chunked" finds ssd_chunked); title hits rank first
  function search(query) {
    const want = words(query);
    if (!want.length) return [];
    const hits = [];
    for (const entry of window.mambalearnIndex || []) {
      const title = words(entry.title), text = words(entry.text);
      const code = entry.kind === "code" || entry.kind === "api";
      const has = (list, w) => list.some((t) => t.startsWith(w) || (code && w.length > 2 && t.includes(w)));
      let score = 0;
      for (const w of want) {
        if (has(title, w)) score += 3;
        else if (has(text, w)) score += 1;
        else { score = 0; break; }
      }
      if (score) hits.push([score, KIND[entry.kind] || 0, entry]);
    }
    return hits.sort((a, b) => b[0] - a[0] || a[1] - b[1]).slice(0, 25).map((h) => h[2]);
  }

  function snippet(text, query) {
    const at = Math.max(0, text.toLowerCase().indexOf(words(query)[0] || ""));
    const start = Math.max(0, at - 40);
    return (start ? "…" : "") + text.slice(start, start + 140) + (text.length > start + 140 ? "…" : "");
  }

  // `text` as nodes, each query word in it wrapped in <mark class="ml-hit">
  function marked(text, query) {
    const want = words(query).map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    const out = document.createDocumentFragment();
    if (!want.length) { out.append(text); return out; }
    const re = new RegExp("(" + want.join("|") + ")", "giu");
    let last = 0;
    for (const m of text.matchAll(re)) {
      out.append(text.slice(last, m.index));
      const mark = document.createElement("mark");
      mark.className = "ml-hit";
      mark.textContent = m[0];
      out.append(mark);
      last = m.index + m[0].length;
    }
    out.append(text.slice(last));
    return out;
  }

  function show(box, list) {
    const q = box.value.trim();
    list.replaceChildren(...search(q).map((e) => {
      const li = document.createElement("li"), a = document.createElement("a");
      const small = document.createElement("small");
      a.href = e.page + "?hl=" + encodeURIComponent(q) + (e.id ? "#" + encodeURIComponent(e.id) : "");
      a.append(marked(e.title, q));
      small.append((e.kind === "code" ? "code · " : "") + e.chapter + " · ", marked(snippet(e.text, q), q));
      li.append(a, small);
      return li;
    }));
    if (q && !list.children.length) list.textContent = "nothing found";
  }

  // on a page opened from a search hit (?hl=words#target): the words marked in the target
  // (its section, code cell or API entry), the first one scrolled into view
  function highlight() {
    const q = new URLSearchParams(location.search).get("hl");
    if (!q) return;
    let scope = document.querySelector("main");
    const id = decodeURIComponent(location.hash.slice(1));
    const target = id && document.getElementById(id);
    if (target) {
      scope = target.closest(".jp-Cell, .ml-api-member, .ml-api-module") || target;
      if (/^H[1-6]$/.test(target.tagName)) {  // a heading: its section, up to the next heading
        scope = target.closest(".jp-Cell") || target;
      }
    }
    const want = words(q);
    const walker = document.createTreeWalker(scope, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) {
      const n = walker.currentNode;
      if (n.parentElement.closest("script, style, mark, .MathJax, .mjx-chtml")) continue;
      if (want.some((w) => n.data.toLowerCase().includes(w))) nodes.push(n);
    }
    for (const n of nodes.slice(0, 200)) n.replaceWith(marked(n.data, q));
    const first = scope.querySelector("mark.ml-hit");
    if (first) first.scrollIntoView({block: "center"});
  }

  // a copy button on every code cell; a long code cell starts folded
  function codeCells() {
    for (const editor of document.querySelectorAll(".jp-CodeCell .jp-InputArea-editor")) {
      const pre = editor.querySelector("pre");
      if (!pre) continue;
      const button = document.createElement("button");
      button.className = "ml-copy";
      button.type = "button";
      button.textContent = "copy";
      button.setAttribute("aria-label", "copy this code");
      button.addEventListener("click", () => copy(pre.innerText.replace(/\n$/, ""), button));
      editor.append(button);
      const lines = pre.innerText.split("\n").length;
      if (lines > (window.mambalearnLongCode || 30)) {
        editor.classList.add("ml-folded");
        const fold = document.createElement("button");
        fold.className = "ml-fold";
        fold.type = "button";
        const label = () => {
          fold.textContent = editor.classList.contains("ml-folded") ? `show all ${lines} lines` : "fold";
        };
        label();
        fold.addEventListener("click", () => { editor.classList.toggle("ml-folded"); label(); });
        editor.after(fold);
      }
    }
  }

  function copy(text, button) {
    const done = () => { button.textContent = "copied"; setTimeout(() => { button.textContent = "copy"; }, 1500); };
    const fallback = () => {  // file:// pages may have no clipboard API
      const area = document.createElement("textarea");
      area.value = text;
      area.style.position = "fixed";
      area.style.opacity = "0";
      document.body.append(area);
      area.select();
      try { document.execCommand("copy"); } catch (e) { /* nothing to copy to */ }
      area.remove();
      done();
    };
    window.mambalearnCopied = text;  // for the tests
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, fallback);
    } else {
      fallback();
    }
  }

  // the outline marks the section on screen
  function outline() {
    const links = [...document.querySelectorAll("nav.ml-side ul.ml-outline a")];
    const heads = links.map((a) => document.getElementById(decodeURIComponent(a.hash.slice(1))))
      .filter(Boolean);
    if (!heads.length) return;
    const update = () => {
      let current = heads[0];
      for (const h of heads) if (h.getBoundingClientRect().top < window.innerHeight * 0.3) current = h;
      const end = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 2;
      if (end && heads[heads.length - 1].getBoundingClientRect().top < window.innerHeight) {
        current = heads[heads.length - 1];  // the page's end: its last section, even if short
      }
      for (const a of links) {
        const on = decodeURIComponent(a.hash.slice(1)) === current.id;
        a.classList.toggle("ml-active", on);
        if (on) a.setAttribute("aria-current", "true"); else a.removeAttribute("aria-current");
      }
    };
    document.addEventListener("scroll", update, {passive: true});
    window.addEventListener("resize", update);
    // a cell folded or unfolded, an image loaded: the page moves under the reader without a scroll
    if (window.ResizeObserver) new ResizeObserver(update).observe(document.body);
    update();
  }

  // printed output wider than the text: each line its own block, wrapped at spaces, indented;
  // code a little wider than the text (a window of a laptop's width) wraps at spaces too, code
  // far wider (a phone) scrolls sideways in its box
  function wrapOutput() {
    for (const pre of document.querySelectorAll(".jp-InputArea-editor pre")) {
      if (pre.scrollWidth > pre.clientWidth + 1 && pre.scrollWidth < 1.3 * pre.clientWidth) {
        pre.classList.add("ml-wrap-code");
      }
    }
    for (const pre of document.querySelectorAll(".jp-OutputArea-output pre")) {
      if (pre.scrollWidth <= pre.clientWidth + 1) continue;
      pre.classList.add("ml-wrap");
      if (pre.children.length) continue;  // links or colours inside: wrapped, not re-lined
      const lines = pre.textContent.replace(/\n$/, "").split("\n");
      pre.replaceChildren(...lines.map((line) => {
        const span = document.createElement("span");
        span.className = "ml-line";
        span.textContent = line || " ";
        return span;
      }));
    }
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
    codeCells();
    wrapOutput();
    outline();
    highlight();
  });
  window.mambalearnSite = {search};  // for the tests
})();
