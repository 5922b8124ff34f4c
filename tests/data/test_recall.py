"""Synthetic recall documents (`recall:SPEC`, `recall-long:SPEC`, `recall-lead:SPEC`, `-dense`): facts, question and
answer agree; lengths; seeds; long values and their kinds; lead lines and answers found by the key; every fact asked
in dense documents; the source spec; existing specs unchanged."""

from __future__ import annotations

import hashlib
import itertools
import random
import re

import pytest

from hyla.data.recall import (DENSE_CHARS_PER_FACT, LONG_KINDS, LONG_VALUE_CHARS, MAX_FACTS, REPEAT_CHARS, long_value,
                               make_document, parse_recall_spec, recall_documents)
from hyla.data.sources import open_source
from hyla.evals.niah_samples import NEEDLE_TEMPLATE

LINES = [f"Line {i} of some ordinary text about nothing in particular." for i in range(4000)]
QUESTION = re.compile(r"Question: What is the (.+) for (\w+)\?\nAnswer: The (.+) for (\w+) is (\S+)\.\Z")


def texts(count: int = 40, lines_per_text: int = 100):
    return ("\n".join(LINES[i * lines_per_text:(i + 1) * lines_per_text]) for i in range(count))


def _asked(doc):
    """The document's body and its question's kind, key and value, each checked against what the document says it
    asked."""
    body, question = doc.text.rsplit("\n\n", 1)
    match = QUESTION.fullmatch(question)
    assert match, question
    kind, key, kind_again, key_again, value = match.groups()
    assert kind == kind_again == doc.kind and key == key_again == doc.keys[doc.asked]
    assert value == doc.values[doc.asked]
    return body, kind, key, value


def test_the_answer_is_the_value_stated_for_the_asked_key_and_only_there():
    docs = list(recall_documents(texts(), seed=0, min_chars=3000, max_chars=9000))
    assert len(docs) > 20
    kinds = set()
    for doc in docs:
        kinds.add(doc.kind)
        body, kind, key, value = _asked(doc)
        assert 1 <= len(doc.keys) <= MAX_FACTS and len(set(doc.keys)) == len(doc.keys)
        # Every fact is one line of the body, naming its key and its value; the haystack lines are untouched.
        lines = body.split("\n")
        for key, val in zip(doc.keys, doc.values):
            facts = [line for line in lines if key in line]
            assert len(facts) == 1 and facts[0].endswith(f"{val}.") and doc.kind in facts[0]
        haystack = [line for line in lines if not any(key in line for key in doc.keys)]
        assert all(line in LINES for line in haystack)
        assert 3000 // 2 <= len("\n".join(haystack)) <= 9000
    assert len(kinds) >= 4  # the kinds of value vary across documents


def test_haystack_is_consecutive_source_text_and_generation_is_seeded():
    first = list(recall_documents(texts(), seed=3, min_chars=2000, max_chars=4000))
    again = list(recall_documents(texts(), seed=3, min_chars=2000, max_chars=4000))
    other = list(recall_documents(texts(), seed=4, min_chars=2000, max_chars=4000))
    assert [d.text for d in first] == [d.text for d in again]
    assert [d.text for d in first] != [d.text for d in other]
    haystack = [line for doc in first for line in doc.text.rsplit("\n\n", 1)[0].split("\n")
                if not any(key in line for key in doc.keys)]
    assert haystack == LINES[: len(haystack)]  # in order, nothing skipped between documents


def test_wording_differs_from_the_niah_evaluation():
    doc = make_document("some text\nmore text", random.Random(0))
    needle_prefix = NEEDLE_TEMPLATE.split("{")[0].strip()
    assert needle_prefix and needle_prefix not in doc.text
    assert "special magic" not in doc.text


def test_spec_forms_and_errors(tmp_path):
    assert parse_recall_spec("recall:stdlib").inner == "stdlib"
    spec = parse_recall_spec("recall@100-200:/data/text")
    assert (spec.inner, spec.min_chars, spec.max_chars) == ("/data/text", 100, 200)
    spec = parse_recall_spec("recall-repeat@300-900:wordnet")
    assert (spec.inner, spec.min_chars, spec.max_chars, spec.repeat) == ("wordnet", 300, 900, True)
    assert parse_recall_spec("recall-repeat:stdlib").repeat and not parse_recall_spec("recall:stdlib").repeat
    for bad in ("recall:", "recall@5:stdlib", "recall@200-100:stdlib", "recall-repeat:", "recall-again:stdlib"):
        with pytest.raises(ValueError, match="recall"):
            parse_recall_spec(bad)
    with pytest.raises(FileNotFoundError, match="source not found"):
        open_source(f"recall:{tmp_path / 'missing'}")


def test_recall_source_wraps_another_source(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    for index in range(3):
        (folder / f"d{index}.txt").write_text("\n".join(LINES[index * 200:(index + 1) * 200]))
    source = open_source(f"recall@1000-2000:{folder}")
    assert "recall documents (1000-2000 characters of haystack) on 3 files" in source.description
    docs = list(source.documents())
    assert len(docs) >= 10 and all("\n\nQuestion: What is the " in doc for doc in docs)


def test_prepare_interleaves_recall_documents_with_plain_text(tmp_path, tokenizer_dir, text_folder, capsys):
    import json

    from hyla.cli import main

    out = tmp_path / "corpus"
    argv = ["data", "prepare", "--tokenizer", str(tokenizer_dir), "--out", str(out), "--no-progress",
            "--source", str(text_folder), "--source", f"recall@300-600:{text_folder}"]
    assert main(argv) == 0
    sources = json.loads((out / "manifest.json").read_text())["sources"]
    assert [s["spec"] for s in sources] == [str(text_folder), f"recall@300-600:{text_folder}"]
    assert all(s["num_tokens"] > 0 for s in sources)


SENTENCES = [f"Sentence {i} says something plain about item {i}." for i in range(3000)]
PROSE = " ".join(SENTENCES)


def test_repeat_haystack_is_one_passage_of_whole_sentences_repeated_with_the_facts_among_the_repetitions():
    # two texts: a passage may span the line break between them (it becomes a space: one line per passage)
    docs = list(recall_documents(iter([" ".join(SENTENCES[:800]), " ".join(SENTENCES[800:])]), seed=1,
                                 min_chars=2000, max_chars=6000, repeat=True))
    assert len(docs) > 20
    passages = []
    for doc in docs:
        body, question = doc.text.rsplit("\n\n", 1)
        match = QUESTION.fullmatch(question)
        assert match and match.group(5) == doc.values[doc.asked]
        lines = body.split("\n")
        facts = [line for line in lines if any(key in line for key in doc.keys)]
        assert len(facts) == len(doc.keys)
        haystack = [line for line in lines if line not in facts]
        assert len(set(haystack)) == 1, "every haystack line is the same passage"
        passage = haystack[0]
        assert passage.startswith("Sentence ") and passage.endswith(".")  # whole sentences of the source
        assert REPEAT_CHARS[0] // 3 <= len(passage) <= 2 * REPEAT_CHARS[1]
        # repeated to the drawn length: within one passage of [min_chars, max_chars]
        assert 2000 - len(passage) - 1 <= len("\n".join(haystack)) <= 6000
        passages.append(passage)
    # consecutive documents repeat consecutive passages of the text: nothing reused, nothing skipped
    assert " ".join(passages) == PROSE[: len(" ".join(passages))]


def test_repeat_documents_are_seeded_and_their_source_says_so(tmp_path):
    first = [d.text for d in recall_documents(iter([PROSE]), seed=2, repeat=True)]
    assert first == [d.text for d in recall_documents(iter([PROSE]), seed=2, repeat=True)]
    assert first != [d.text for d in recall_documents(iter([PROSE]), seed=3, repeat=True)]
    (tmp_path / "a.txt").write_text(PROSE)
    source = open_source(f"recall-repeat@1000-2000:{tmp_path / 'a.txt'}")
    assert "recall documents (1000-2000 characters of one repeated passage)" in source.description
    assert len(list(source.documents())) > 50


def _digest(documents, count: int) -> str:
    texts_ = [doc if isinstance(doc, str) else doc.text for doc in itertools.islice(documents, count)]
    assert len(texts_) == count
    return hashlib.sha256("\x00".join(texts_).encode()).hexdigest()


def test_existing_specs_give_the_documents_they_always_gave(tmp_path):
    # sha256 of the first documents, computed with the code of a11ebb9 (before values could be long): a change to
    # the RNG draws, templates, kinds or haystack cutting of the existing specs changes these.
    assert _digest(recall_documents(texts(), seed=0, min_chars=1000, max_chars=3000), 40) == (
        "5b41c044fcb821db0bec12600dd84e54b570a9b0e24d9f2fda6a0472a639eef9")
    assert _digest(recall_documents(iter([PROSE]), seed=1, min_chars=1000, max_chars=3000, repeat=True), 40) == (
        "8f8216e88af950e345c3cefbe9c8a25468e6f060ea1c599c19a8a7943389bd13")
    folder = tmp_path / "text"
    folder.mkdir()
    for index in range(3):
        (folder / f"d{index}.txt").write_text("\n".join(LINES[index * 200:(index + 1) * 200]))
    assert _digest(open_source(f"recall@500-1500:{folder}", seed=5).documents(), 20) == (
        "d8b7b2662b323dbe77dce99539a6d7612c5fe9bf3d255b0db14cbcf59e76b193")
    assert _digest(open_source(f"recall-repeat@500-1500:{folder}", seed=5).documents(), 20) == (
        "69147f05d5c25126db0c9cae03e9a320773b0c86f16447163d5e925d5aa90de6")


# RULER's SK3/MK3 value layout (str(uuid.UUID(...))), written here apart from the module's own guard
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def test_long_spec_forms_and_errors(tmp_path):
    spec = parse_recall_spec("recall-long:stdlib")
    assert (spec.inner, spec.min_chars, spec.repeat, spec.long_values) == ("stdlib", 2000, False, True)
    spec = parse_recall_spec("recall-repeat-long@300-900:wordnet")
    assert (spec.inner, spec.min_chars, spec.max_chars, spec.repeat, spec.long_values) == (
        "wordnet", 300, 900, True, True)
    assert parse_recall_spec("recall-long@100-200:recall:stdlib").inner == "recall:stdlib"
    assert not parse_recall_spec("recall-repeat:stdlib").long_values
    for bad in ("recall-long:", "recall-long-repeat:stdlib", "recall-longer:stdlib", "recall-long@9-3:stdlib",
                "recall-long@5:stdlib", "recall-repeat-long-long:stdlib"):
        with pytest.raises(ValueError, match="recall"):
            parse_recall_spec(bad)
    with pytest.raises(ValueError, match=r"recall\[-repeat\]\[-lead\]\[-long\]"):
        open_source("recall-long-repeat:stdlib")  # the recall forms named, not "source not found"
    (tmp_path / "a.txt").write_text(PROSE)
    source = open_source(f"recall-repeat-long@1000-2000:{tmp_path / 'a.txt'}")
    assert "(1000-2000 characters of one repeated passage, values of 16-48 characters)" in source.description
    docs = list(source.documents())
    assert len(docs) > 50 and all(len(doc.rsplit(" is ", 1)[1]) >= 17 for doc in docs)  # value and "."


def _long_documents(seed: int, repeat: bool = False):
    if repeat:
        return list(recall_documents(iter([PROSE]), seed=seed, min_chars=1000, max_chars=3000, repeat=True,
                                     long_values=True))
    return list(recall_documents(texts(), seed=seed, min_chars=1000, max_chars=3000, long_values=True))


def test_long_documents_are_seeded():
    first = _long_documents(seed=3)
    assert [d.text for d in first] == [d.text for d in _long_documents(seed=3)]
    assert [d.text for d in first] != [d.text for d in _long_documents(seed=4)]
    # the same seed with short values gives other documents: the variant is not the old spec under another name
    short = list(recall_documents(texts(), seed=3, min_chars=1000, max_chars=3000))
    assert {v for d in first for v in d.values}.isdisjoint(v for d in short for v in d.values)


@pytest.mark.parametrize("repeat", [False, True])
def test_long_values_are_16_to_48_characters_of_several_kinds_and_the_answer_copies_the_inserted_value(repeat):
    docs = _long_documents(seed=0, repeat=repeat)
    assert len(docs) > 50
    lengths = {doc.kind: set() for doc in docs}
    for doc in docs:
        body, kind, key, value = _asked(doc)
        # the answer's value is the one inserted for the asked key, in the one fact line naming that key
        facts = [line for line in body.split("\n") if re.search(rf"\b{key}\b", line)]  # Ishte is not Ishtemi
        assert len(facts) == 1 and facts[0].endswith(f" {value}.") and kind in facts[0]
        for val in doc.values:
            assert LONG_VALUE_CHARS[0] <= len(val) <= LONG_VALUE_CHARS[1] and " " not in val
            lengths[doc.kind].add(len(val))
    assert len(lengths) >= 5, lengths  # six kinds; 50+ documents draw at least five of them
    all_lengths = set().union(*lengths.values())
    assert min(all_lengths) <= 22 and max(all_lengths) >= 40  # lengths spread over the range, not one size
    assert all("uuid" not in kind and "magic" not in kind for kind in lengths)


def test_every_long_kind_keeps_its_layout_and_never_gives_a_uuid():
    rng = random.Random(0)
    layouts = {"license key": r"[A-Z0-9]{4,8}(-[A-Z0-9]{4,8}){2,5}",
               "recovery code": r"[0-9a-f]{3,12}(-[0-9a-f]{3,12}){2,5}", "build hash": r"[0-9a-f]{20,40}",
               "session token": r"[A-Za-z0-9]{24,40}", "tracking code": r"[A-Z]{2}[0-9]-[A-Z0-9]{13,30}",
               "account number": r"[0-9]{4}(-[0-9]{4}){3,5}"}
    assert [kind for kind, _ in LONG_KINDS] == list(layouts)
    for kind, make in LONG_KINDS:
        values = [make(rng) for _ in range(3000)]
        assert all(re.fullmatch(layouts[kind], value) for value in values), kind
        assert not any(UUID.search(value) for value in values), kind
        assert len({len(value) for value in values}) >= 3, kind  # varied lengths within each kind (4-6 groups: 3)
    for doc in _long_documents(seed=1) + _long_documents(seed=2, repeat=True):
        assert not UUID.search(doc.text.rsplit("\n\n", 1)[1])
        assert not any(UUID.search(value) for value in doc.values)


def test_a_drawn_value_shaped_like_a_uuid_or_out_of_range_is_drawn_again():
    drawn = iter(["0f8fad5b-d9cb-469f-a165-70867728950e", "X-0F8FAD5B-D9CB-469F-A165-70867728950E", "short",
                  "a" * 49, "KX7-48QZT1M0W9B2C6RJ"])
    assert long_value(random.Random(0), lambda rng: next(drawn)) == "KX7-48QZT1M0W9B2C6RJ"


def _words_in_common_at_the_end(first: str, second: str) -> int:
    count = 0
    for a, b in zip(reversed(first.split()), reversed(second.split())):
        if a != b:
            break
        count += 1
    return count


@pytest.mark.parametrize("repeat,long_values", [(False, False), (True, False), (False, True)])
def test_lead_documents_open_with_a_keyless_line_and_answer_only_by_the_key(repeat, long_values):
    source = iter([PROSE]) if repeat else texts()
    docs = list(recall_documents(source, seed=0, min_chars=1000, max_chars=3000, repeat=repeat,
                                 long_values=long_values, lead=True))
    assert len(docs) > 50
    leads, answers = set(), set()
    for doc in docs:
        body, qa = doc.text.rsplit("\n\n", 1)
        question, answer = qa.split("\n")
        key, value = doc.keys[doc.asked], doc.values[doc.asked]
        assert question.startswith("Question: ") and key in question and doc.kind in question
        assert answer.startswith("Answer: ") and answer.endswith(f" is {value}.") and key in answer
        lines = body.split("\n")
        lead = lines[0]
        # the lead line names the kind and says " is ", names no key and gives no value
        assert doc.kind in lead and " is " in lead
        assert not any(re.search(rf"\b{k}\b", lead) for k in doc.keys)
        assert not any(v in lead for v in doc.values)
        leads.add(lead.replace(doc.kind, "KIND"))
        facts = [line for line in lines[1:] if any(re.search(rf"\b{k}\b", line) for k in doc.keys)]
        assert len(facts) == len(doc.keys)
        [fact] = [line for line in facts if re.search(rf"\b{key}\b", line)]
        assert fact.endswith(f" {value}.") and doc.kind in fact
        # before its value the answer is no fact's sentence and ends like none: the last word ("is") at most
        prefix = answer.removeprefix("Answer: ")[: -len(f" {value}.")]
        for line, val in zip(facts, doc.values):
            assert prefix not in line
            assert _words_in_common_at_the_end(prefix, line[: -len(f" {val}.")]) <= 1, (prefix, line)
        # the haystack is the variant's own: the lines that are neither lead nor fact
        haystack = [line for line in lines[1:] if line not in facts]
        assert len(set(haystack)) == 1 if repeat else all(line in LINES for line in haystack)
        answers.add(re.sub(rf"\b{key}\b", "KEY", prefix.replace(doc.kind, "KIND")))
        assert "special magic" not in doc.text and "hidden within" not in doc.text  # not RULER's wording
    assert len(leads) == 4 and len(answers) == 4  # every lead line and answer wording is drawn


def test_lead_spec_forms_are_seeded_and_leave_the_other_variants_unchanged(tmp_path):
    spec = parse_recall_spec("recall-repeat-lead-long@300-900:wordnet")
    assert (spec.inner, spec.min_chars, spec.max_chars, spec.repeat, spec.lead, spec.long_values) == (
        "wordnet", 300, 900, True, True, True)
    assert parse_recall_spec("recall-lead:stdlib").lead and not parse_recall_spec("recall-long:stdlib").lead
    for bad in ("recall-lead-repeat:stdlib", "recall-long-lead:stdlib", "recall-lead-lead:stdlib", "recall-lead:"):
        with pytest.raises(ValueError, match=r"recall\[-repeat\]\[-lead\]\[-long\]"):
            parse_recall_spec(bad)
    first = [d.text for d in recall_documents(texts(), seed=3, min_chars=1000, max_chars=3000, lead=True)]
    assert first == [d.text for d in recall_documents(texts(), seed=3, min_chars=1000, max_chars=3000, lead=True)]
    assert first != [d.text for d in recall_documents(texts(), seed=4, min_chars=1000, max_chars=3000, lead=True)]
    (tmp_path / "a.txt").write_text(PROSE)
    source = open_source(f"recall-repeat-lead@1000-2000:{tmp_path / 'a.txt'}")
    assert "one repeated passage, a lead line, answers found by the key)" in source.description
    assert len(list(source.documents())) > 50


def test_lead_and_long_specs_give_the_documents_they_gave_before_dense_existed():
    # sha256 of the first documents, computed with the code of 3b3d600 (before -dense)
    def digest(source, **options):
        return _digest(recall_documents(source, seed=2 if not options.get("repeat") else 1, min_chars=1000,
                                        max_chars=3000, **options), 40)

    assert digest(texts(), lead=True) == "6472b939ba9addbc38e8238699f0bb52b5c7b08e0b27fe37b2ea65aa2bb49d95"
    assert digest(texts(), lead=True, long_values=True) == (
        "baa870709f2202d3e8ead3e3d2a9faa35a998de4801dfe3c93dcb07a462e297d")
    assert digest(texts(), long_values=True) == "72f2cd3966623a053a7670fc613849625121b1e782dddbc1e109fad86c6ea353"
    assert digest(iter([PROSE]), lead=True, repeat=True) == (
        "d918ec1fb71f5f5edf2ac4118704968be3a733b32ce2ec0c0646c6a166a5103c")


LEAD_QA = re.compile(r"Question: .+\nAnswer: .*\b(\w+)\b.* is (\S+)\.")


@pytest.mark.parametrize("repeat,long_values,lead", [(False, False, True), (True, False, True), (False, True, True),
                                                     (False, False, False)])
def test_dense_documents_hold_a_fact_per_2000_characters_and_ask_each_once_in_a_random_order(repeat, long_values,
                                                                                              lead):
    source = iter([PROSE * 3]) if repeat else texts(count=200)
    docs = list(recall_documents(source, seed=0, min_chars=4000, max_chars=20000, repeat=repeat,
                                 long_values=long_values, lead=lead, dense=True))
    assert len(docs) > 10
    counts, orders = set(), set()
    for doc in docs:
        count = len(doc.keys)
        counts.add(count)
        assert len(set(doc.keys)) == count and sorted(doc.order) == list(range(count)) and doc.asked == doc.order[0]
        if count >= 8:
            orders.add(doc.order == tuple(range(count)))
        pairs = doc.text.split("\n\n")
        body, qas = "\n\n".join(pairs[:-count]), pairs[-count:]
        lines = body.split("\n")[1 if lead else 0:]
        facts = [line for line in lines if any(re.search(rf"\b{k}\b", line) for k in doc.keys)]
        haystack = "\n".join(line for line in lines if line not in facts)
        # a fact every DENSE_CHARS_PER_FACT characters of haystack, at least MAX_FACTS, each on its own line
        assert count == max(MAX_FACTS, len(haystack) // DENSE_CHARS_PER_FACT) and len(facts) == count
        for index, qa in zip(doc.order, qas):
            key, value = doc.keys[index], doc.values[index]
            question, answer = qa.split("\n")
            assert question.startswith("Question: ") and re.search(rf"\b{key}\b", question) and doc.kind in question
            assert answer.startswith("Answer: ") and answer.endswith(f" is {value}.") and key in answer
            [fact] = [line for line in facts if re.search(rf"\b{key}\b", line)]
            assert fact.endswith(f" {value}.")
            if not lead:
                assert QUESTION.fullmatch(qa)
    assert len(counts) > 3 and max(counts) >= 8  # the count follows the haystack's length
    assert orders == {False}  # the questions are not asked in the facts' order


def test_dense_spec_forms_are_seeded_and_say_so(tmp_path):
    spec = parse_recall_spec("recall-repeat-lead-long-dense@300-900:wordnet")
    assert (spec.inner, spec.min_chars, spec.repeat, spec.lead, spec.long_values, spec.dense) == (
        "wordnet", 300, True, True, True, True)
    assert parse_recall_spec("recall-dense:stdlib").dense and not parse_recall_spec("recall-lead:stdlib").dense
    for bad in ("recall-dense-lead:stdlib", "recall-dense-long:stdlib", "recall-dense-dense:stdlib"):
        with pytest.raises(ValueError, match=r"recall\[-repeat\]\[-lead\]\[-long\]\[-dense\]"):
            parse_recall_spec(bad)
    first = [d.text for d in recall_documents(texts(), seed=3, min_chars=1000, max_chars=9000, dense=True)]
    assert first == [d.text for d in recall_documents(texts(), seed=3, min_chars=1000, max_chars=9000, dense=True)]
    assert first != [d.text for d in recall_documents(texts(), seed=4, min_chars=1000, max_chars=9000, dense=True)]
    (tmp_path / "a.txt").write_text("\n".join(LINES))
    source = open_source(f"recall-lead-dense@4000-8000:{tmp_path / 'a.txt'}")
    assert f"a fact every {DENSE_CHARS_PER_FACT} characters, each asked)" in source.description
    docs = list(source.documents())
    assert docs and all(doc.count("Question: ") >= MAX_FACTS for doc in docs)


VOCABULARY = ("harbour river lantern window garden process kernel module letter market engine signal meadow "
              "copper silver forest valley bridge castle planet thunder pencil marble ladder mirror basket "
              "blanket candle carpet cotton desert island jungle lemon").split()
WORDY = " ".join(f"The {VOCABULARY[i % 34]} near the {VOCABULARY[(i * 7) % 34]} was {i}." for i in range(6000))


@pytest.mark.parametrize("lead,dense", [(False, False), (True, False), (True, True)])
def test_word_keys_are_two_or_three_of_the_haystacks_own_words(lead, dense):
    docs = list(recall_documents(iter([WORDY]), seed=0, min_chars=3000, max_chars=9000, lead=lead, dense=dense,
                                 word_keys=True))
    assert len(docs) > 3
    for doc in docs:
        pairs = doc.text.split("\n\n")
        count = len(doc.order)
        body, qas = "\n\n".join(pairs[:-count]), pairs[-count:]
        lines = body.split("\n")[1 if lead else 0:]
        facts = [line for line in lines if any(key in line for key in doc.keys)]
        haystack = "\n".join(line for line in lines if line not in facts)
        assert len(set(doc.keys)) == len(doc.keys) == len(facts)
        for key in doc.keys:
            parts = key.split("-")
            assert 2 <= len(parts) <= 3 and len(set(parts)) == len(parts)
            # each part a whole word of the haystack, lower case: one of WORDY's, or what the haystack's cuts left of
            # one at its start or end ("irror", "engi")
            text = haystack.lower()
            assert all(re.fullmatch(r"[a-z]{4,12}", part) and re.search(rf"\b{part}\b", text) for part in parts), key
            assert all(part in VOCABULARY or part == "near" or text.startswith(part) or text.endswith(part)
                       for part in parts), key
        for index, qa in zip(doc.order, qas):
            assert doc.keys[index] in qa and qa.endswith(f" is {doc.values[index]}.")
        if not lead:
            for qa in qas:  # the plain question's wording, a hyphenated key in place of a name
                plain = r"Question: What is the (.+) for ([\w-]+)\?\nAnswer: The (.+) for ([\w-]+) is (\S+)\."
                assert re.fullmatch(plain, qa)


def test_word_keys_fall_back_to_made_up_names_on_a_small_vocabulary_and_leave_other_specs_alone(tmp_path):
    # LINES hold 7 distinct words of 4-12 letters: fewer than WORD_KEY_MIN_VOCABULARY.
    with_words = list(recall_documents(texts(), seed=2, min_chars=1000, max_chars=3000, lead=True, word_keys=True))
    without = list(recall_documents(texts(), seed=2, min_chars=1000, max_chars=3000, lead=True))
    assert [d.text for d in with_words] == [d.text for d in without]
    assert all(re.fullmatch(r"[A-Z][a-z]+", key) for doc in without for key in doc.keys)
    spec = parse_recall_spec("recall-repeat-lead-long-dense-words@300-900:wordnet")
    assert (spec.repeat, spec.lead, spec.long_values, spec.dense, spec.word_keys, spec.min_chars) == (
        True, True, True, True, True, 300)
    assert not parse_recall_spec("recall-lead-dense:wordnet").word_keys
    with pytest.raises(ValueError, match=r"\[-dense\]\[-words\]"):
        parse_recall_spec("recall-words-lead:wordnet")
    (tmp_path / "a.txt").write_text(WORDY)
    source = open_source(f"recall-lead-words@2000-4000:{tmp_path / 'a.txt'}")
    assert "keys of the haystack's words" in source.description
    docs = list(source.documents())
    assert docs and docs == list(open_source(f"recall-lead-words@2000-4000:{tmp_path / 'a.txt'}").documents())


def test_word_keys_give_way_to_made_up_names_when_a_document_asks_for_more_keys_than_its_words_make():
    # 8 words make 8 x 7 x 7 = 392 keys of 2-3 words; a dense haystack of ~1M characters asks for ~500 facts.
    haystack = "\n".join(" ".join(VOCABULARY[:8]) for _ in range(20000))
    doc = make_document(haystack, random.Random(0), dense=True, word_keys=True)
    assert len(doc.keys) == len(haystack) // DENSE_CHARS_PER_FACT > 392
    assert all(re.fullmatch(r"[A-Z][a-z]+", key) for key in doc.keys)
    small = make_document("\n".join(" ".join(VOCABULARY[:8]) for _ in range(100)), random.Random(0), dense=True,
                          word_keys=True)
    assert all("-" in key for key in small.keys)  # 4 facts: word keys
