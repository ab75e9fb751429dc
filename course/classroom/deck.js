// The mambalearn deck, laid out in the browser before reveal.js starts (see deck.py).
//
// Every slide must fit reveal's SLIDE_W x SLIDE_H box. Sizes are only known once the page is
// laid out, fonts loaded and math typeset, so this runs then, on every (sub)slide:
//   1. a <pre> (code or printed output) wider than the slide gets a smaller font, down to
//      MIN_FONT px; one still too wide wraps at spaces
//      (never inside a word, and never at a hyphen: "ssd-h200.json" stays one piece); so does a
//      display formula, down to MIN_MATH of its size;
//   2. content below the slide's bottom moves to a continuation slide right after it (same
//      stack, so the arrow keys reach it), headed "<title> (cont.)": whole cells where they can,
//      else the block that crosses the bottom is split (a markdown cell between paragraphs,
//      printed output between lines, at a blank line where one is near). A code cell's source
//      is never split, nor parted from its output: the cell moves on whole, or only its output
//      is cut, after at least MIN_LINES of it;
//      A block that cannot be cut and is taller than the room left keeps its slide, and what
//      follows it moves on;
//   3. what still does not fit (one figure or block taller than a slide) is scaled down: a
//      code cell's source to a font of no less than MIN_CODE px, then, if the cell is still
//      taller than the slide, it scrolls inside its slide (class ml-scroll); a figure to no
//      less than MIN_IMAGE of its size, a slide's content (zoom on a div inside the section,
//      so the section stays 960 px wide) to no less than MIN_ZOOM; a figure on a slide with
//      room to spare grows, up to MAX_GROW.
// Then reveal.js starts (linear navigation: the arrow keys step through every slide and
// fragment) and window.mambalearnDeck.ready becomes true.
(function () {
  "use strict";
  const SLIDE_W = 960, SLIDE_H = 700;
  const LIMIT = SLIDE_H - 12;       // px from a slide's top that its content may reach
  const NOBREAK = 50;  // characters: a longer hyphenated word may wrap at a hyphen
  const MIN_FONT = 14, MIN_CODE = 12, MIN_MATH = 0.7, MIN_IMAGE = 0.6, MIN_ZOOM = 0.7, MIN_LINES = 3, MAX_GROW = 1.6;
  const deck = window.mambalearnDeck = {ready: false, continued: 0, scaled: []};

  const rect = (el) => el.getBoundingClientRect();
  const bottomIn = (el, section) => rect(el).bottom - rect(section).top;
  // a heading, or a markdown cell that is only a heading
  const isHeading = (el) => /^H[1-6]$/.test(el.tagName) || el.classList.contains("ml-cont")
      || (el.classList.contains("jp-MarkdownCell") && (() => {
        const md = el.querySelector(".jp-RenderedMarkdown");
        const kids = md ? blocks(md) : [];
        return kids.length === 1 && /^H[1-6]$/.test(kids[0].tagName);
      })());

  // the laid-out children of a container (prompts, collapsers and notes take no room)
  function blocks(el) {
    return [...el.children].filter((c) => c.tagName !== "SCRIPT" && c.tagName !== "ASIDE"
        && (c.getClientRects().length > 0) && rect(c).height > 0);
  }

  // may `el` be cut between its children? (only elements whose text sits in child elements)
  function isContainer(el) {
    if (el.tagName === "PRE") return el.classList.contains("ml-wrap");  // lines are blocks
    if (!/^(SECTION|DIV|UL|OL|BLOCKQUOTE)$/.test(el.tagName)) return false;
    if (/MathJax|mjx|jp-RenderedImage/.test(el.className)) return false;
    return [...el.childNodes].every((n) => n.nodeType !== Node.TEXT_NODE || !n.data.trim());
  }

  // an empty copy of `el` (same tag and classes, no id) to hold what moves on
  function shell(el) {
    const copy = el.cloneNode(false);
    copy.removeAttribute("id");
    return copy;
  }

  // Cut `el` so that what stays ends above LIMIT in `section`; returns the rest, or null.
  function split(el, section) {
    if (el.tagName === "PRE" && !el.classList.contains("ml-wrap")) return splitPre(el, section);
    if (!isContainer(el)) return null;
    const kids = blocks(el);
    let k = kids.findIndex((c) => bottomIn(c, section) > LIMIT);
    if (k < 0) return null;
    let rest = null;
    if (el.classList.contains("jp-CodeCell")) {
      // its source never splits, nor leaves its output: cut inside the output, or not at all
      if (kids[k].classList.contains("jp-Cell-inputWrapper")) return null;
      const inner = split(kids[k], section);
      if (inner === null) return null;
      rest = shell(el);
      rest.append(inner, ...kids.slice(k + 1));
      return rest;
    }
    if (kids.slice(0, k).some((c) => !isHeading(c))) {
      while (isHeading(kids[k - 1])) k--;  // a heading goes with what it introduces
      rest = shell(el);
      rest.append(...kids.slice(k));
    } else {
      const inner = split(kids[k], section);
      if (inner === null) return null;
      rest = shell(el);
      rest.append(inner, ...kids.slice(k + 1));
    }
    return rest;
  }

  // Cut a <pre> between lines: the lines that fit stay, the others move on.
  function splitPre(pre, section) {
    const text = pre.textContent.replace(/\n$/, "");
    const lines = text.split("\n");
    const style = getComputedStyle(pre);
    const pad = parseFloat(style.paddingTop), padB = parseFloat(style.paddingBottom);
    const lineH = (pre.scrollHeight - pad - padB) / lines.length;
    const room = LIMIT - (rect(pre).top - rect(section).top) - pad - padB;
    let keep = Math.min(lines.length - 1, Math.floor(room / lineH));
    if (keep < MIN_LINES) return null;
    for (let j = keep; j >= Math.ceil(keep * 0.6); j--) {  // prefer a cut after a blank line
      if (lines[j - 1].trim() === "") { keep = j; break; }
    }
    const range = document.createRange();  // the first `keep` lines, tags split where they cross
    range.setStart(pre, 0);
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    let seen = 0;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      let at = -1;
      while (seen < keep && (at = node.data.indexOf("\n", at + 1)) >= 0) seen++;
      if (seen === keep) { range.setEnd(node, at + 1); break; }
    }
    const head = range.extractContents();
    const rest = shell(pre);
    rest.append(...pre.childNodes);
    pre.append(head);
    return rest;
  }

  // "<title> (cont.)", from the first heading of the slide the continuation belongs to
  function contHeading(title) {
    const h = document.createElement("h3");
    h.className = "ml-cont";
    h.innerHTML = title;
    h.querySelectorAll("script, .anchor-link").forEach((e) => e.remove());
    h.querySelectorAll("[id]").forEach((e) => e.removeAttribute("id"));
    h.append(" (cont.)");
    return h;
  }

  // a <pre> wider than the slide: a smaller font; below MIN_FONT, its long lines wrap at spaces
  // (never inside a word) with a hanging indent, so a continued line reads as one
  function fitWidths(root) {
    for (const pre of root.querySelectorAll(".reveal .slides pre")) {
      for (let i = 0; i < 3 && pre.scrollWidth > pre.clientWidth + 1; i++) {
        const size = parseFloat(getComputedStyle(pre).fontSize);
        const fit = Math.floor(2 * size * pre.clientWidth / pre.scrollWidth) / 2;
        pre.style.fontSize = Math.max(MIN_FONT, Math.min(fit, size - 0.5)) + "px";
      }
      if (pre.scrollWidth > pre.clientWidth + 1) hangLines(pre);
    }
    // a display formula wider than its line: a smaller font for it alone (MathJax sizes in em)
    for (const display of root.querySelectorAll(".reveal .slides .MJXc-display")) {
      const formula = display.querySelector(".MathJax_CHTML");
      const room = rect(display).width, width = formula ? rect(formula).width : 0;
      if (width > room) {
        display.style.fontSize = Math.max(MIN_MATH, Math.floor(100 * room / width) / 100) * 100 + "%";
      }
    }
  }

  // one block per source line (tags split where a token spans lines), for the hanging indent
  function hangLines(pre) {
    const lines = [];
    for (let end = firstNewline(pre); end; end = firstNewline(pre)) {
      const range = document.createRange();
      range.setStart(pre, 0);
      range.setEnd(end.node, end.at);
      lines.push(range.extractContents());  // the line; what remains starts with its newline
      const nl = firstNewline(pre);
      nl.node.deleteData(nl.at, 1);
    }
    if (pre.textContent) {
      const range = document.createRange();
      range.selectNodeContents(pre);
      lines.push(range.extractContents());
    }
    pre.replaceChildren(...lines.map((line) => {
      const span = document.createElement("span");
      span.className = "ml-line";
      span.append(line.textContent ? line : "\u200b");  // an empty line keeps its height
      return span;
    }));
    pre.classList.add("ml-wrap");
    keepHyphenated(pre);
  }

  // a word with a hyphen in it (a file name, "fwd+bwd-h200", "--flag") wraps as one piece: the
  // browser would break a pre-wrap line after any hyphen
  function keepHyphenated(pre) {
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (/\S-|-\S/.test(node.data)) nodes.push(node);
    }
    for (const node of nodes) {
      const parts = node.data.split(/(\S*-\S*)/);
      node.replaceWith(...parts.filter((t) => t).map((t) => {
        // (one longer than half a line may still break: it could not fit on a line anyway)
        if (!t.includes("-") || t.length > NOBREAK) return document.createTextNode(t);
        const span = document.createElement("span");
        span.className = "ml-nobreak";
        span.textContent = t;
        return span;
      }));
    }
  }

  function firstNewline(el) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const at = node.data.indexOf("\n");
      if (at >= 0) return {node, at};
    }
    return null;
  }

  // The blocks after the first one that crosses the bottom (which cannot be cut), moved to a
  // continuation: a figure after a code cell too long for any slide gets a slide of its own
  // instead of being shrunk beside it. Returns the continuation, or null.
  function splitAfter(section) {
    const kids = blocks(section);
    const k = kids.findIndex((c) => bottomIn(c, section) > LIMIT);
    if (k < 0 || k === kids.length - 1) return null;
    const rest = shell(section);
    rest.append(...kids.slice(k + 1));
    return rest;
  }

  function paginate(section) {
    const heading = section.querySelector("h1, h2, h3");
    const title = heading ? heading.innerHTML : "";
    for (let guard = 0; guard < 40 && extent(section).bottom > LIMIT; guard++) {
      // one block taller than a slide stays alone (scaled below), what follows it moves on
      // a code cell too tall to keep whole: its source in a smaller font, else scrolling in a
      // box that leaves room for the first lines of its output, which is then cut there
      let rest = split(section, section);
      if (rest === null && fitCode(section, false)) rest = split(section, section);
      if (rest === null && scrollCode(section)) rest = split(section, section);
      if (rest === null) rest = splitAfter(section);
      if (rest === null) break;
      if (title) rest.prepend(contHeading(title));
      section.after(rest);
      const lead = blocks(rest).find((c) => !isHeading(c));
      if (lead) lead.classList.remove("fragment");  // the new slide is the step; no extra click
      deck.continued++;
      section = rest;
    }
  }

  // the extent of what a slide shows, in px from its top left (notes and the hidden MathML
  // copy of each formula, kept for screen readers, take no room)
  function extent(section) {
    const box = rect(section), text = document.createRange();
    let right = 0, bottom = 0;
    for (const el of section.querySelectorAll("*")) {
      if (el.closest("aside.notes, script, .MJX_Assistive_MathML")) continue;
      const scroller = el.closest(".ml-scroll");  // what scrolls inside its box takes that box
      if (scroller && scroller !== el) continue;
      const rects = [rect(el)];
      for (const c of scroller ? [] : el.childNodes) {  // text can run past its element's box
        if (c.nodeType !== Node.TEXT_NODE || !c.data.trim()) continue;
        text.selectNodeContents(c);
        rects.push(...text.getClientRects());
      }
      for (const r of rects) {
        if (r.width === 0 || r.height === 0) continue;
        right = Math.max(right, r.right - box.left);
        bottom = Math.max(bottom, r.bottom - box.top);
      }
    }
    return {right, bottom};
  }

  // the last resort: shrink the tallest figure, then the whole slide, within limits; or, where
  // room is left, let the largest figure grow into it (figures are drawn at twice their size)
  function scale(section) {
    const imgs = [...section.querySelectorAll("img")].sort((a, b) => rect(b).height - rect(a).height);
    const over = extent(section).bottom - LIMIT;
    if (imgs.length) {
      const img = imgs[0], r = rect(img), room = rect(img.parentElement).width;
      const grow = Math.min(MAX_GROW, (r.height - over) / r.height, room / r.width);
      if (grow > 1.05 || grow < 1) {
        img.style.height = Math.max(grow, MIN_IMAGE) * r.height + "px";
        img.style.width = "auto";
        img.style.maxWidth = "100%";
      }
    }
    fitCode(section);
    const {right, bottom} = extent(section);
    const zoom = Math.min(1, LIMIT / bottom, SLIDE_W / right);
    if (zoom < 1) {
      // the slide's content, not the slide, is zoomed: the section keeps reveal's width, so its
      // own size (scrollWidth, scrollHeight) is what the audience sees
      const inner = document.createElement("div");
      inner.className = "ml-zoom";
      inner.append(...section.childNodes);
      section.append(inner);
      inner.style.zoom = Math.max(MIN_ZOOM, Math.floor(zoom * 100) / 100);
      deck.scaled.push([section.querySelector("h1, h2, h3")?.textContent, inner.style.zoom]);
    }
  }

  // a code cell's source taller than the slide has room for: a smaller font, down to MIN_CODE
  // px; still too tall (and `scroll`), it scrolls inside the slide (what a presenter scrolls
  // while talking). Returns whether a font changed.
  function fitCode(section, scroll = true) {
    let changed = false;
    for (const pre of section.querySelectorAll(".jp-Cell-inputWrapper pre")) {
      for (let i = 0; i < 8 && extent(section).bottom > LIMIT; i++) {
        const size = parseFloat(getComputedStyle(pre).fontSize);
        if (size <= MIN_CODE) break;
        const over = extent(section).bottom - LIMIT, h = rect(pre).height;
        const fit = Math.floor(2 * size * Math.max(0.5, (h - over) / h)) / 2;
        pre.style.fontSize = Math.max(MIN_CODE, Math.min(fit, size - 0.5)) + "px";
        changed = true;
      }
      if (!scroll) continue;
      const over = extent(section).bottom - LIMIT;
      if (over > 0) {
        const h = rect(pre).height;
        pre.style.maxHeight = Math.max(5 * parseFloat(getComputedStyle(pre).lineHeight), h - over) + "px";
        pre.style.overflowY = "auto";
        pre.classList.add("ml-scroll");
        deck.scrolls = (deck.scrolls || 0) + 1;
      }
    }
    return changed;
  }

  // The first code cell source that crosses the bottom scrolls in a box that ends MIN_LINES + 1
  // output lines above it (at least 5 lines of code shown). Returns whether one did.
  function scrollCode(section) {
    for (const pre of section.querySelectorAll(".jp-Cell-inputWrapper pre:not(.ml-scroll)")) {
      if (bottomIn(pre, section) <= LIMIT) continue;
      const cell = pre.closest(".jp-CodeCell");
      const out = cell && cell.querySelector(".jp-OutputArea-output pre");
      const line = parseFloat(getComputedStyle(pre).lineHeight);
      const room = out ? (MIN_LINES + 1) * parseFloat(getComputedStyle(out).lineHeight) + 16 : 0;
      const top = rect(pre).top - rect(section).top;
      pre.style.maxHeight = Math.max(5 * line, LIMIT - top - room) + "px";
      pre.style.overflowY = "auto";
      pre.classList.add("ml-scroll");
      deck.scrolls = (deck.scrolls || 0) + 1;
      return true;
    }
    return false;
  }

  function slidesOf(root) {
    return [...root.querySelectorAll(".reveal .slides > section > section")];
  }

  function mathDone() {
    return new Promise((resolve) => {
      if (!window.MathJax || !window.MathJax.Hub) return resolve();
      setTimeout(resolve, 30000);  // math that never finishes must not keep the deck closed
      // after the startup's typeset, behind whatever else is queued. The hook must return
      // nothing: MathJax waits for a callback a hook returns, and this one waits for MathJax.
      MathJax.Hub.Register.StartupHook("End", () => { MathJax.Hub.Queue(resolve); });
    });
  }

  async function layout() {
    const t0 = performance.now(), times = deck.times = {};
    await mathDone();
    times.math = performance.now() - t0;
    await document.fonts.ready;
    await Promise.all([...document.images].map((i) => i.decode().catch(() => null)));
    times.loaded = performance.now() - t0;
    fitWidths(document);
    slidesOf(document).forEach(paginate);
    slidesOf(document).forEach(scale);
    document.documentElement.classList.remove("ml-layout");
    times.layout = performance.now() - t0;
  }

  deck.start = function (options) {
    layout().then(() => require([options.reveal, options.notes], (Reveal, RevealNotes) => {
      window.Reveal = Reveal;
      Reveal.initialize(Object.assign({}, options.config, {plugins: [RevealNotes]}));
      Reveal.on("ready", () => { deck.ready = true; });
    }));
  };
})();
