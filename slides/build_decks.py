"""Build the workshop decks: Markdown sections + the reference run's figures -> Marp -> HTML, PDF.

A deck is one course part. Its slides are written per notebook, in
``slides/decks/partN/NN_slug.md``, and a section goes into the deck only when its notebook
exists in ``notebooks/src/``: a notebook still being written is skipped at build time (and
so is a deck none of whose notebooks exist). Sections use three directives, filled in from
``slides/figures/manifest.json`` (written by ``export_figures.py`` from a reference run):

* ``{{figure NN_slug/NAME}}`` (optionally ``{{figure NN_slug/NAME h:400}}``): the PNG the
  notebook drew, with a caption naming the notebook section, the cell, the machine, the date
  and the mode of the run;
* ``{{value NN_slug/KEY}}``: a number or name read from that run's output;
* ``{{run NN_slug}}``: the run's machine, date and mode, as one line.

Every deck ends with a generated slide listing the runs its figures come from. An unknown
directive, or a figure or value the manifest lacks, stops the build.

    python slides/build_decks.py              # Markdown, HTML and PDF into slides/build/
    python slides/build_decks.py --no-render  # Markdown only (no Node, no browser)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
DECKS = SLIDES / "decks"
BUILD = SLIDES / "build"
MANIFEST = SLIDES / "figures" / "manifest.json"
NOTEBOOK_SOURCES = ROOT / "notebooks" / "src"
MARP = SLIDES / "node_modules" / ".bin" / "marp"
DEFAULT_BROWSER = "/usr/bin/chromium"


@dataclass(frozen=True)
class Part:
    number: int
    title: str
    notebooks: range    # notebook numbers this part covers


PARTS = [
    Part(1, "Setup and the pain points of serving", range(0, 2)),
    Part(2, "KV-cache math, the roofline and quantization", range(2, 5)),
    Part(3, "Attention variants, FlashAttention, paged attention, prefix caching, "
            "speculative decoding", range(5, 10)),
    Part(4, "The showdown and the decision chart", range(10, 12)),
    Part(5, "The shared queue, cold starts, the gateway, what applications send, many replicas",
         range(12, 100)),
]

FRONT_MATTER = """---
marp: true
theme: default
paginate: true
size: 16:9
title: "{title}"
footer: "LLM-inference workshop · part {number}"
style: |
  section {{ font-size: 26px; }}
  section.title h1 {{ font-size: 44px; }}
  div.caption {{ font-size: 15px; color: #555; margin-top: 4px; }}
  section.sources {{ font-size: 19px; }}
  section.dense {{ font-size: 20px; }}
  section.dense table {{ font-size: 17px; }}
  div.columns {{ display: grid; grid-template-columns: 1fr 1fr; gap: 24px; }}
  img {{ display: block; margin: 0 auto; }}
---
"""

DIRECTIVE = re.compile(r"\{\{\s*(\w+)\s+([^}\s]+)(?:\s+([^}]*?))?\s*\}\}")


class BuildError(RuntimeError):
    """A deck refers to something the reference run does not have."""


def notebook_number(name: str) -> int:
    return int(name.split("_", 1)[0])


def existing_notebooks(sources: Path = NOTEBOOK_SOURCES) -> list[str]:
    return sorted(p.stem for p in sources.glob("[0-9]*.py"))


def plan(notebooks: list[str], decks: Path = DECKS) -> tuple[dict[int, list[str]], list[str]]:
    """({part number: notebooks with slides, in order}, messages about what is skipped)."""
    included: dict[int, list[str]] = {}
    notes = []
    for part in PARTS:
        mine = [n for n in notebooks if notebook_number(n) in part.notebooks]
        with_slides = [n for n in mine if (decks / f"part{part.number}" / f"{n}.md").exists()]
        for n in mine:
            if n not in with_slides:
                notes.append(f"part {part.number}: notebook {n} has no slides yet "
                             f"(slides/decks/part{part.number}/{n}.md)")
        orphans = sorted(p.stem for p in (decks / f"part{part.number}").glob("[0-9]*.md")
                         if p.stem not in mine)
        for n in orphans:
            notes.append(f"part {part.number}: skipping slides for {n}: the notebook does not "
                         "exist")
        if with_slides:
            included[part.number] = with_slides
        else:
            notes.append(f"part {part.number}: not built (no notebook in "
                         f"{part.notebooks.start:02d}-{part.notebooks.stop - 1:02d} with slides)")
    return included, notes


def run_caption(manifest: dict, notebook: str) -> str:
    run = manifest.get("runs", {}).get(notebook)
    if run is None:
        raise BuildError(f"no reference run of {notebook} in the manifest: run "
                         f"slides/export_figures.py for it")
    mode = f"{run['mode']}-mode run" if run.get("mode") else "run"
    engine = f", {run['engine']}" if run.get("engine") else ""
    return f"{mode} on {run['machine']}, {run['date']}{engine}"


def expand(text: str, manifest: dict, image_prefix: str = "../") -> str:
    """Replace the {{...}} directives of one section; raise BuildError on any unknown one."""
    def one(m: re.Match) -> str:
        kind, ref, opts = m.group(1), m.group(2), (m.group(3) or "").strip()
        if kind == "figure":
            fig = manifest.get("figures", {}).get(ref)
            if fig is None:
                raise BuildError(f"figure {ref!r} is not in the manifest (export_figures.py "
                                 f"FIGURES lists what it exports)")
            size = opts or "h:430"
            number = notebook_number(fig["notebook"])
            where = f"notebook {number}, “{fig['section']}”, cell {fig['cell']}"
            return (f"![{size}]({image_prefix}{fig['file']})\n\n"
                    f"<div class=\"caption\">{where} · "
                    f"{run_caption(manifest, fig['notebook'])}</div>")
        if kind == "value":
            notebook, _, key = ref.partition("/")
            value = manifest.get("values", {}).get(notebook, {}).get(key)
            if value is None:
                raise BuildError(f"value {ref!r} is not in the manifest (export_figures.py VALUES)")
            return str(value)
        if kind == "run":
            return run_caption(manifest, ref)
        raise BuildError(f"unknown directive {m.group(0)!r}")
    return DIRECTIVE.sub(one, text)


def sources_slide(manifest: dict, notebooks: list[str]) -> str:
    lines = ["<!-- _class: sources -->", "", "## Where the figures and numbers come from", ""]
    for n in notebooks:
        run = manifest["runs"][n]
        figs = [f for f in manifest["figures"].values() if f["notebook"] == n]
        cells = ", ".join(str(f["cell"]) for f in sorted(figs, key=lambda f: f["cell"]))
        lines.append(f"- **{n}**: {run_caption(manifest, n)}; {len(figs)} figures, "
                     f"cells {cells}; "
                     f"whole run: `slides/{run['reference_page']}`")
    lines += ["", "Regenerate with `bash scripts/build_slides.sh --refresh` (re-runs the "
              "notebooks on your machine). Figures carry no hand-edited values; facts not "
              "measured in a run are cited on the slide that uses them.", "",
              "<!-- Point people at the reference pages: the whole executed notebook, "
              "with the machine and date at the top, is the evidence for every plot. -->"]
    return "\n".join(lines)


def deck_markdown(part: Part, notebooks: list[str], manifest: dict, decks: Path = DECKS) -> str:
    folder = decks / f"part{part.number}"
    pieces = [FRONT_MATTER.format(title=f"Part {part.number}: {part.title}", number=part.number)]
    title = folder / "_title.md"
    if title.exists():
        pieces.append(expand(title.read_text(), manifest))
    for n in notebooks:
        pieces.append(expand((folder / f"{n}.md").read_text(), manifest))
    pieces.append(sources_slide(manifest, notebooks))
    # Sections are written without a separator before their first slide; add it here.
    return pieces[0] + "\n" + "\n\n---\n\n".join(p.strip("\n") for p in pieces[1:]) + "\n"


def browser_path() -> str | None:
    path = os.environ.get("CHROME_PATH") or DEFAULT_BROWSER
    return path if Path(path).exists() else shutil.which("chromium")


def render(md: Path, browser: str) -> list[Path]:
    """HTML and PDF of one deck through Marp CLI, with the given Chromium."""
    if not MARP.exists():
        raise BuildError(f"{MARP} is missing: run `npm ci` in slides/ (scripts/build_slides.sh "
                         "does)")
    env = dict(os.environ, CHROME_PATH=browser)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["CHROME_NO_SANDBOX"] = "1"   # Chromium refuses to start as root with its sandbox
    outputs = []
    for ext, extra in ((".html", []), (".pdf", ["--pdf", "--pdf-notes"])):
        out = md.with_suffix(ext)
        cmd = [str(MARP), "--config-file", str(SLIDES / ".marprc.yml"), "--html",
               "--allow-local-files", "--browser", "chrome",
               "--browser-path", browser, *extra, str(md), "-o", str(out)]
        r = subprocess.run(cmd, cwd=SLIDES, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not out.exists():
            raise BuildError(f"marp failed on {md.name} -> {ext}:\n{r.stdout}\n{r.stderr}")
        outputs.append(out)
    return outputs


def build(out_dir: Path = BUILD, render_decks: bool = True) -> list[Path]:
    """Write one Markdown deck per part that has slides (and HTML and PDF); return them."""
    if not MANIFEST.exists():
        raise BuildError(f"{MANIFEST} is missing: run slides/export_figures.py first")
    manifest = json.loads(MANIFEST.read_text())
    included, notes = plan(existing_notebooks())
    for note in notes:
        print(note)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    browser = browser_path() if render_decks else None
    if render_decks and browser is None:
        raise BuildError("no Chromium found: install it (Debian: apt-get install chromium) or "
                         "set CHROME_PATH")
    built = []
    for part in PARTS:
        if part.number not in included:
            continue
        md = out_dir / f"part{part.number}.md"
        md.write_text(deck_markdown(part, included[part.number], manifest))
        built.append(md)
        if render_decks:
            built += render(md, browser)
        print(f"part {part.number}: {', '.join(included[part.number])} -> "
              f"{', '.join(p.name for p in built if p.stem == md.stem)}")
    return built


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def screenshot_slides(html_file: Path, out_dir: Path, which: str = "ends",
                      browser: str | None = None) -> tuple[list[Path], list[str]]:
    """PNGs of a built HTML deck's slides in headless Chromium, and the page's console errors.

    ``which`` is ``"ends"`` (first and last slide) or ``"all"``. Needs the ``playwright``
    Python package; the browser is the system Chromium (no browser download).
    """
    from playwright.sync_api import sync_playwright

    browser = browser or browser_path()
    if browser is None:
        raise BuildError("no Chromium found: set CHROME_PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    shots, errors = [], []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser, args=CHROMIUM_ARGS, headless=True)
        try:
            page = b.new_page(viewport={"width": 1280, "height": 720})
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(html_file.resolve().as_uri(), wait_until="load")
            # the on-screen controller of Marp's presenter template would cover slide content
            page.add_style_tag(content=".bespoke-marp-osc { display: none !important; }")
            count = page.locator("svg[data-marpit-svg]").count()
            if count == 0:
                raise BuildError(f"{html_file.name}: no Marp slides in the page")
            numbers = range(1, count + 1) if which == "all" else sorted({1, count})
            for n in numbers:
                page.goto(f"{html_file.resolve().as_uri()}#{n}", wait_until="load")
                page.wait_for_timeout(300)   # the bespoke template switches slides on hashchange
                shot = out_dir / f"{html_file.stem}-{n:02d}.png"
                page.screenshot(path=str(shot))
                shots.append(shot)
        finally:
            b.close()
    return shots, errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-render", action="store_true", help="write the Markdown decks only")
    p.add_argument("--out", type=Path, default=BUILD, help="output folder (default slides/build)")
    p.add_argument("--screenshots", choices=["ends", "all"],
                   help="also save PNGs of the first and last (or all) slides of each deck to "
                        "OUT/png, failing on any browser console error (needs playwright)")
    a = p.parse_args(argv)
    try:
        built = build(a.out, render_decks=not a.no_render)
        for html_file in (f for f in built if f.suffix == ".html" and a.screenshots):
            shots, errors = screenshot_slides(html_file, a.out / "png", a.screenshots)
            print(f"{html_file.name}: {len(shots)} slide PNGs in {a.out / 'png'}")
            if errors:
                raise BuildError(f"{html_file.name}: browser errors:\n  " + "\n  ".join(errors))
    except BuildError as e:
        print(f"build_decks: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
