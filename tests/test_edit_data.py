"""Next-edit training tasks (draft_models/edit_data.py): every kind yields tasks whose user change
is one site, whose answer changes only the region, and whose changes are the same change at the
other sites; the own prompt format tokenizes as the engine will read it."""
from __future__ import annotations

import ast
import difflib
import random
import re
from collections import Counter

import pytest

from draft_models.edit_data import KINDS, make_task, sample_ids
from draft_models.edit_format import HistoryItem, changed_lines, own_history, own_prompt

SOURCE = '''\
import os


class Store:
    def __init__(self, root, limit=10):
        self.root = root
        self.limit = limit
        self.items = []

    def add(self, name, value):
        path = os.path.join(self.root, name)
        if len(self.items) >= self.limit:
            raise ValueError("full")
        self.items.append((path, value))
        print("added", path)
        return path

    def find(self, name):
        for path, value in self.items:
            if os.path.basename(path) == name:
                print("found", path)
                return value
        print("missing", name)
        return None


def total(values, start=0):
    result = start
    for v in values:
        result = result + v
        print("step", result)
    print("step", result)
    return result
'''


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_carries_one_change_to_the_region(kind):
    rng = random.Random(3)
    made = 0
    for _ in range(30):
        t = make_task(SOURCE, "store.py", rng, kind=kind, noop_rate=0.0)
        if t is None:
            continue
        made += 1
        ast.parse(t.current)
        ast.parse(t.expected)
        before, cur, exp = (s.splitlines(keepends=True) for s in (t.before, t.current, t.expected))
        assert len(before) == len(cur) == len(exp)  # every kind edits within lines
        changed = [i for i, (a, b) in enumerate(zip(before, cur)) if a != b]
        assert changed == [t.line]  # the user's change: one line, the cursor's
        lo, hi = t.region
        assert lo <= t.line < hi
        moved = [i for i, (a, b) in enumerate(zip(cur, exp)) if a != b]
        assert moved and all(lo <= i < hi for i in moved)  # the answer edits the region only
        assert t.sites >= len(moved)
        # the answer is the user's change again: each changed line differs as the user's line did
        user_removed = set(_words(before[t.line]) - _words(cur[t.line]))
        user_added = set(_words(cur[t.line]) - _words(before[t.line]))
        for i in moved:
            if kind == "remove_arg":  # the last argument of each call goes, whatever it is
                assert len(exp[i]) < len(cur[i]) and exp[i].count(",") <= cur[i].count(",")
                continue
            assert set(_words(cur[i]) - _words(exp[i])) <= user_removed, (kind, cur[i], exp[i])
            assert set(_words(exp[i]) - _words(cur[i])) <= user_added, (kind, cur[i], exp[i])
        assert t.history == [HistoryItem("store.py", before[t.line], cur[t.line])]
        assert 0 <= t.col <= len(cur[t.line])
    assert made >= 3, kind


def _words(line: str) -> Counter:
    return Counter(re.findall(r"\w+|\S", line))


def test_noop_tasks_answer_the_region_unchanged():
    rng = random.Random(0)
    found = 0
    for _ in range(200):
        t = make_task(SOURCE, "store.py", rng, noop_rate=1.0)
        if t is not None and t.sites == 0:
            assert t.expected == t.current
            found += 1
    assert found


def test_unparsable_files_and_files_without_sites_give_none():
    rng = random.Random(0)
    assert make_task("def f(:\n", "x.py", rng) is None
    assert make_task("x = 1\n", "x.py", rng) is None
    assert make_task("", "x.py", rng) is None


def test_own_format_history_and_sample_ids(embedded_tokenizer):
    tok = embedded_tokenizer
    assert changed_lines("a\nb\nc\n", "a\nB\nc\n") == "-b\n+B\n"
    hist = [HistoryItem("other.py", "x = 1\n", "x = 2\n"), HistoryItem("store.py", "y\n", "z\n")]
    assert own_history(hist, "store.py") == "# other.py\n-x = 1\n+x = 2\n-y\n+z\n"
    pieces = own_prompt(hist, "store.py", "    return y\n")
    assert [p.text for p in pieces if p.special] == ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    t = make_task(SOURCE, "store.py", random.Random(1), kind="rename_local", noop_rate=0.0)
    ids, start = sample_ids(t, tok, lambda s: tok.encode(s, add_special_tokens=False).ids)
    assert ids[start - 1] == tok.token_to_id("<fim_middle>") and ids[-1] == tok.token_to_id("<|endoftext|>")
    assert tok.decode(ids[start:-1]) == t.region_text(t.expected)
    region = tok.encode(t.region_text(), add_special_tokens=False).ids
    assert ids[start - 1 - len(region):start - 1] == region  # the region as the drafter's original


@pytest.fixture(scope="module")
def embedded_tokenizer():
    from tokenizers import Tokenizer

    from draft_models import DEFAULT_TARGET
    return Tokenizer.from_file(str(DEFAULT_TARGET / "tokenizer.json"))


def test_expected_diff_is_small():
    """A rename's answer differs from the region by the renamed spans, not by rewritten lines."""
    t = make_task(SOURCE, "store.py", random.Random(2), kind="rename_local", noop_rate=0.0)
    ops = [o for o in difflib.SequenceMatcher(None, t.current, t.expected, autojunk=False).get_opcodes()
           if o[0] != "equal"]
    assert 1 <= len(ops) <= t.sites * 2


def test_copy_tasks_answer_their_region_and_prefetched_batches_are_the_same(embedded_tokenizer):
    """The fine-tune's copy stage (finetune_edits.MixedStream._copy): a prompt with no history
    whose answer, the only tokens with a loss, is the region's tokens again (code, or a shuffle of
    its tokens). Batches made ahead by forked workers (train.batches) equal those made in line."""
    import torch

    from draft_models.finetune_edits import MixedStream
    from draft_models.train import batches

    tok = embedded_tokenizer
    texts = [SOURCE, SOURCE.replace("Store", "Shelf")]
    stream = MixedStream(texts, ["a.py", "b.py"], tok, 512, seed=3, edit_rate=1.0, max_region_chars=300,
                         copy_rate=1.0)
    rng, shuffled = random.Random(0), 0
    for _ in range(30):
        ids, start = stream._copy(rng)
        region = ids[:start - 1][2:]  # <fim_prefix> (no history) <fim_suffix> REGION <fim_middle>
        assert ids[:2] == [tok.token_to_id("<fim_prefix>"), tok.token_to_id("<fim_suffix>")]
        assert ids[start:-1] == region and ids[-1] == tok.token_to_id("<|endoftext|>")
        shuffled += tok.decode(region) not in "".join(texts)
    assert 0 < shuffled < 30
    x, y = stream.batch(0, 2)
    rows = (y != -100).any(1)
    assert rows.all() and x.shape[0] == 4  # an edit step: twice the batch size, every row with an answer
    inline = list(batches(stream, 2, 6, 2))
    ahead = list(batches(stream, 2, 6, 2, workers=2))
    assert len(ahead) == 4 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(inline, ahead))


def test_induction_rows_repeat_a_string_of_frequent_tokens(embedded_tokenizer):
    """The fine-tune's first stage (finetune_edits.InductionStream): `<fim_suffix> s <fim_middle>
    s s`, the loss on the two repeats only, s drawn from the given frequent tokens; a pure
    function of the step."""
    import torch

    from draft_models.finetune_edits import InductionStream

    tok = embedded_tokenizer
    frequent = list(range(100, 140))
    stream = InductionStream(frequent, tok, seed=1)
    x, y = stream.batch(7, 3)
    n = (x.shape[1] - 2) // 3
    assert 16 <= n <= 48 and x.shape == (3, 3 * n + 2)
    for row, lab in zip(x.tolist(), y.tolist()):
        s = row[1:n + 1]
        assert row == [tok.token_to_id("<fim_suffix>")] + s + [tok.token_to_id("<fim_middle>")] + s + s
        assert set(s) <= set(frequent)
        assert [t for t in lab if t != -100] == s + s and lab[n + 1:3 * n + 1] == s + s
    assert all(torch.equal(a, b) for a, b in zip(stream.batch(7, 3), (x, y)))


def test_realign_rows_copy_an_edited_string_and_mix_into_edit_steps(embedded_tokenizer):
    """finetune_edits.RealignStream: `<fim_prefix><fim_suffix> s <fim_middle> s' <eos>` with s' = s
    after a few span edits; the loss is on the tokens of s' that copy s (never on an inserted or
    replaced one) and on the end; the tokens come from the given vocabulary. MixedStream's edit
    steps carry such rows at `realign_rate`, and batches made from them are the same again."""
    import difflib

    import torch

    from draft_models.finetune_edits import MixedStream, RealignStream

    tok = embedded_tokenizer
    vocab = list(range(100, 1100))
    stream = RealignStream(vocab, tok, seed=2)
    pre, suf, mid, eos = (tok.token_to_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"))
    rng, edited = random.Random(4), 0
    for _ in range(40):
        ids, labels = stream.row(rng)
        m = ids.index(mid)
        s, out = ids[2:m], ids[m + 1:-1]
        assert ids[:2] == [pre, suf] and ids[-1] == eos and len(ids) == len(labels)
        assert 16 <= len(s) <= 320 and set(s) | set(out) <= set(vocab)
        assert labels[:m + 1] == [-100] * (m + 1) and labels[-1] == eos
        kept = [t for t in labels[m + 1:-1] if t != -100]
        # the labelled tokens are a subsequence of s (copies) and of the answer
        sm = difflib.SequenceMatcher(None, s, kept, autojunk=False)
        assert sum(b.size for b in sm.get_matching_blocks()) == len(kept)
        edited += out != s
    assert 10 < edited < 40  # 0..4 edits a row: most are edited, some not
    x, y = stream.batch(3, 4)
    assert x.shape[0] == 4 and all(torch.equal(a, b) for a, b in zip(stream.batch(3, 4), (x, y)))

    mixed = MixedStream([SOURCE], ["a.py"], tok, 1024, seed=1, edit_rate=1.0, max_region_chars=300,
                        realign=stream, realign_rate=1.0)
    x, y = mixed.batch(0, 2)
    assert x.shape[0] == 4 and (x[:, 2:] == suf).sum() == 0 and (x[:, 1] == suf).all()
    assert all(torch.equal(a, b) for a, b in zip(mixed.batch(0, 2), (x, y)))


def test_substitute_rows_rename_an_arbitrary_span_everywhere(embedded_tokenizer):
    """finetune_edits.SubstituteStream: `<fim_prefix> -L +L' <fim_suffix> R <fim_middle> R' <eos>`:
    L' is L with a span X replaced by Y; R holds that line as L' and X at other places; the answer
    R' is R with every X replaced by Y (R unchanged where X is nowhere else), the loss on all of
    it. MixedStream's edit steps carry such rows at `subst_rate`; batches repeat."""
    import difflib

    import torch

    from draft_models.finetune_edits import MixedStream, SubstituteStream

    tok = embedded_tokenizer
    vocab = list(range(300, 2300))
    stream = SubstituteStream([SOURCE], vocab, tok, seed=5)
    pre, suf, mid, eos = (tok.token_to_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"))
    minus, plus = tok.encode("-").ids[0], tok.encode("+").ids[0]
    rng, changed = random.Random(6), 0
    for _ in range(40):
        ids, labels = stream.row(rng)
        s, m = ids.index(suf), ids.index(mid)
        hist, region, answer = ids[1:s], ids[s + 1:m], ids[m + 1:-1]
        assert ids[0] == pre and hist[0] == minus and plus in hist and ids[-1] == eos
        assert labels == [-100] * (m + 1) + ids[m + 1:]
        # the answer is the region with one substitution made at one or more places
        ops = {(tuple(region[a:b]), tuple(answer[c:d]))
               for tag, a, b, c, d in difflib.SequenceMatcher(None, region, answer, autojunk=False).get_opcodes()
               if tag != "equal"}
        if ops:  # the same X → Y at each (places side by side merge into X X → Y Y)
            x, y = min(ops, key=lambda o: len(o[0]) + len(o[1]))
            times = [len(o) // len(x) if x else len(n) // len(y) for o, n in ops]
            assert all(o == x * c and n == y * c for (o, n), c in zip(ops, times)), ops
            new_line = hist[len(hist) - hist[::-1].index(plus):]  # Y is in the history's new line
            assert set(y) <= set(new_line) and all(t in region for t in new_line)
        changed += answer != region
    assert 20 < changed <= 40
    x, y = stream.batch(2, 3)
    assert all(torch.equal(a, b) for a, b in zip(stream.batch(2, 3), (x, y)))
    mixed = MixedStream([SOURCE], ["a.py"], tok, 1024, seed=1, edit_rate=1.0, max_region_chars=300,
                        subst=stream, subst_rate=1.0)
    x, y = mixed.batch(0, 2)
    assert x.shape[0] == 4 and (x[:, 0] == pre).all() and (x[:, 1] == minus).all()


def test_a_stage_ends_on_its_measured_accuracy_and_stays_ended(embedded_tokenizer, tmp_path):
    """train.run_stage's `stop_acc` (the fine-tune's induction stage runs until its copies jump):
    the stage ends at the first evaluation that reaches it, checkpointed as ended, and a rerun
    resumes there without training on. Without it the stage runs all its steps."""
    import json

    from draft_models.finetune_edits import InductionStream
    from draft_models.train import ModelShape, TrainConfig, new_model, run_stage

    tok = embedded_tokenizer
    stream = InductionStream(list(range(100, 140)), tok, seed=1)
    cfg = TrainConfig(steps=12, batch_size=2, lr=1e-3, warmup=1, ckpt_every=100, log_every=100, eval_every=4,
                      eval_batches=1, bf16=False)
    lines = []
    model = new_model(ModelShape(32, 1, 2, 64), tok.get_vocab_size(), 160, tok, seed=0)
    got = run_stage("s", model, stream, stream, cfg, tmp_path, lines.append, stop_acc=0.0)
    assert got["steps"] == 4 and any("the stage ends at step 4" in ln for ln in lines)
    before = json.dumps({k: v.tolist() for k, v in list(model.state_dict().items())[:2]})
    again = run_stage("s", model, stream, stream, cfg, tmp_path, lines.append, stop_acc=0.0)
    assert again["steps"] == 4 and any("ended early" in ln for ln in lines)
    assert json.dumps({k: v.tolist() for k, v in list(model.state_dict().items())[:2]}) == before
    full = run_stage("t", new_model(ModelShape(32, 1, 2, 64), tok.get_vocab_size(), 160, tok, seed=0), stream, stream,
                     cfg, tmp_path, lines.append)
    assert full["steps"] == 12


def test_site_weights_mark_the_tokens_an_edit_changes_and_weigh_the_loss(embedded_tokenizer, tmp_path):
    """`--site-weight` (the fine-tune's lever on the skill its models lacked: carrying the change
    to the next site, 0.57 of those tokens right where 0.98 of all answer tokens were): an edit
    row's answer tokens that are not a copy of its region carry the weight, every other token 1;
    the rows themselves are the same as without it; run_stage takes the weighted mean, and the
    held-out evaluation reports those tokens' accuracy apart."""
    import torch

    from draft_models.finetune_edits import MixedStream, changed_positions
    from draft_models.train import ModelShape, TrainConfig, new_model, run_stage

    tok = embedded_tokenizer
    enc = lambda s: tok.encode(s).ids
    region, answer = "    path = join(root, name)\n    print(path)\n", "    where = join(root, name)\n    print(where)\n"
    got = changed_positions(enc(region), enc(answer))
    assert got and tok.decode([enc(answer)[j] for j in got]).replace(" ", "") == "wherewhere"
    assert changed_positions(enc(region), enc(region)) == []

    plain = MixedStream([SOURCE], ["a.py"], tok, 1024, seed=2, edit_rate=1.0, max_region_chars=400, copy_rate=0.0)
    weighed = MixedStream([SOURCE], ["a.py"], tok, 1024, seed=2, edit_rate=1.0, max_region_chars=400, copy_rate=0.0,
                          site_weight=5.0)
    x0, y0 = plain.batch(0, 3)
    x, y, w = weighed.batch(0, 3)
    assert torch.equal(x, x0) and torch.equal(y, y0)
    assert set(w[y != -100].tolist()) == {1.0, 5.0} and (w[y == -100] <= 1).all()
    for b in range(x.shape[0]):  # the weighed targets are the ids the answer changed
        start = int((y[b] != -100).nonzero()[0]) + 1  # the first answer id's position
        end = int((y[b] != -100).nonzero()[-1])  # the last target: the end-of-text id
        ids = x[b, : end + 1].tolist() + [int(y[b, end])]
        sep = ids.index(tok.token_to_id("<fim_middle>"))
        region_ids = ids[ids.index(tok.token_to_id("<fim_suffix>")) + 1: sep]
        marked = {i + 1 for i in (w[b] == 5.0).nonzero().flatten().tolist()}
        assert marked == {start + j for j in changed_positions(region_ids, ids[start:-1])}

    cfg = TrainConfig(steps=3, batch_size=2, lr=1e-3, warmup=1, ckpt_every=100, log_every=1, eval_every=3,
                      eval_batches=1, bf16=False)
    lines = []
    model = new_model(ModelShape(32, 1, 2, 64), tok.get_vocab_size(), 1024, tok, seed=0)
    res = run_stage("w", model, weighed, weighed, cfg, tmp_path, lines.append)
    assert 0 <= res["site_acc"] <= 1 and res["steps"] == 3


def test_a_continuation_trains_on_tasks_its_source_has_not_seen(tmp_path):
    """The fine-tune's streams are pure functions of (seed, step): a continuation with its source's
    seed would learn the same tasks again from step 0. The default seed is one the source's
    record has not used; one asked for that was used is kept, and said to repeat."""
    from draft_models.finetune_edits import pick_seed, seeds_seen

    assert seeds_seen(tmp_path) == []  # no record: a pair never fine-tuned here
    assert pick_seed([], None) == (0, False)
    (tmp_path / "build_summary.json").write_text('{"edits_finetune": {"seeds": [0, 11]}}')
    seen = seeds_seen(tmp_path)
    assert seen == [0, 11]
    assert pick_seed(seen, None) == (1, False)
    assert pick_seed([0, 1, 2], None) == (3, False)
    assert pick_seed(seen, 11) == (11, True) and pick_seed(seen, 5) == (5, False)


def test_kind_weights_set_the_mix_and_bad_ones_are_refused():
    """--kind-weights: a kind left out keeps its default share; a kind weighed 0 is never drawn;
    an unknown kind, a weight that is no number or below 0, or all zero: a clear error."""
    from draft_models.edit_data import KIND_WEIGHTS, parse_kind_weights
    from draft_models.finetune_edits import main

    assert parse_kind_weights("") == KIND_WEIGHTS
    w = parse_kind_weights("rename_local=0.5, remove_arg=0")
    assert w[KINDS.index("rename_local")] == 0.5 and w[KINDS.index("remove_arg")] == 0
    assert w[KINDS.index("literal")] == KIND_WEIGHTS[KINDS.index("literal")]
    only = parse_kind_weights(",".join(f"{k}={int(k == 'rename_attr')}" for k in KINDS))
    rng = random.Random(3)
    tasks = [make_task(SOURCE, "store.py", rng, weights=only, noop_rate=1.0) for _ in range(30)]
    assert {t.kind for t in tasks if t is not None} == {"rename_attr"}
    for bad, says in (("renames=1", "KIND one of"), ("literal", "KIND=WEIGHT"), ("literal=x", "not a number"),
                      ("literal=-1", "≥ 0"), ("literal=nan", "≥ 0"),
                      (",".join(f"{k}=0" for k in KINDS), "above 0")):
        with pytest.raises(ValueError, match=says):
            parse_kind_weights(bad)
    with pytest.raises(SystemExit) as e:  # the recipe refuses it before it loads anything
        main(["--kind-weights", "renames=1"])
    assert e.value.code == 2


def test_grown_layers_compute_the_same_until_trained(tmp_path):
    """--grow-layers: the deeper model gives the same logits (and the same greedy tokens through
    its KV cache) as the one it grew from, saves and loads as an ordinary Llama of that depth,
    and its new layers learn (their zeroed projections move on the first step)."""
    import torch
    from conftest import random_llama
    from transformers import LlamaForCausalLM

    from draft_models.finetune_edits import grow_layers

    m = random_llama(32, 3, seed=7)
    x = torch.randint(1, 64, (1, 20))
    before = m(x).logits
    gen_before = m.generate(x, max_new_tokens=8, do_sample=False)
    assert grow_layers(m, 3) == [] and grow_layers(m, 2) == []
    added = grow_layers(m, 5)
    assert len(added) == 2 and len(m.model.layers) == 5 and m.config.num_hidden_layers == 5
    assert [layer.self_attn.layer_idx for layer in m.model.layers] == list(range(5))
    assert torch.equal(m(x).logits, before)
    assert torch.equal(m.generate(x, max_new_tokens=8, do_sample=False), gen_before)
    m.save_pretrained(tmp_path / "grown")
    back = LlamaForCausalLM.from_pretrained(tmp_path / "grown", torch_dtype=torch.float64).eval()
    assert back.config.num_hidden_layers == 5 and torch.equal(back(x).logits, before)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(x, labels=x).loss.backward()
    opt.step()
    for i in added:
        assert m.model.layers[i].self_attn.o_proj.weight.abs().sum() > 0
        assert m.model.layers[i].mlp.down_proj.weight.abs().sum() > 0
